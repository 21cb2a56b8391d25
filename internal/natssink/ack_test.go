package natssink

import (
	"encoding/json"
	"testing"
)

// FuzzScanAck: whatever JetStream answers, the answer scanAck reads is
// the one encoding/json reads, and scanAck reads the answers the server
// sends for a stored message (the seeds) itself.
func FuzzScanAck(f *testing.F) {
	stored := []string{
		`{"stream":"STUDENTS","seq":12}`,
		`{"stream":"STUDENTS","seq":12,"duplicate":true}`,
		`{"stream":"KV_R","domain":"hub","seq":9999999999999999999}`,
		`{"stream":"STUDENTS","seq":7,"batch":"b1","count":2}`,
	}
	for _, s := range stored {
		f.Add([]byte(s))
		if _, ok := scanAck([]byte(s), "STUDENTS"); !ok {
			f.Errorf("scanAck does not read %s", s)
		}
	}
	for _, s := range []string{
		`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"},"stream":"STUDENTS","seq":0}`,
		`{"stream":"STU\u0044ENTS","seq":1}`, `{"Stream":"X","seq":1}`, `{"stream":"X","seq":1,"seq":2}`,
		`{"stream":"X","seq":01}`, `{"stream":"X","seq":18446744073709551616}`, `{"stream":"X", "seq":1}`,
		`{"stream":"X","seq":1,"duplicate":tru}`, `{}`, `{"stream":"X","seq":1}x`, `{"stream":"é","seq":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, ok := scanAck(data, "STUDENTS")
		if !ok {
			return
		}
		var want ack
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatalf("scanAck read %q, which encoding/json refuses: %v", data, err)
		}
		if got != want {
			t.Fatalf("scanAck read %q as %+v, encoding/json as %+v", data, got, want)
		}
	})
}
