package main

import "testing"

func TestSelected(t *testing.T) {
	for _, c := range []struct {
		name, only string
		want       bool
	}{
		{"student-bridge (3 replicas, 16 shards)", "", true},
		{"student-bridge (3 replicas, 16 shards)", "3 replicas", true},
		{"student-bridge (3 replicas, 16 shards)", "=student-bridge (3 replicas, 16 shards)", true},
		{"student-bridge (1 replica, 16 shards)", "=student-bridge (3 replicas, 16 shards)", false},
		{"student-bridge (1 replica, 16 shards)", "raw,=student-bridge (3 replicas, 16 shards)", false},
		{"raw-informer", "raw,=student-bridge (3 replicas, 16 shards)", true},
		{"student-bridge", "=student-bridge", true},
		{"student-bridge (process)", "=student-bridge", false},
	} {
		if got := selected(c.name, c.only); got != c.want {
			t.Errorf("selected(%q, %q) = %v, want %v", c.name, c.only, got, c.want)
		}
	}
}
