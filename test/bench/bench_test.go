package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestSmoke runs the whole harness briefly, so that `make bench` cannot rot:
// every variant runs, the bridge delivers every change, and the memory and
// restart phase reports that nothing was republished.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode")
	}
	var out bytes.Buffer
	err := bench(context.Background(), options{rates: []int{20}, duration: 2 * time.Second, reps: 1, students: []int{20, 40}}, &out)
	if err != nil {
		t.Fatal(err)
	}
	table := out.String()
	t.Log("\n" + table)
	for _, v := range variants {
		row := regexp.MustCompile(`(?m)^\| ` + regexp.QuoteMeta(v.name) + ` \| 20 \| .*\| (\d+)/(\d+) \| (\d+) \|`).FindStringSubmatch(table)
		if row == nil {
			t.Errorf("no row for %s", v.name)
			continue
		}
		if row[1] != row[2] || row[1] == "0" || row[3] != "0" {
			t.Errorf("%s: covered %s of %s changes, lost %s final states", v.name, row[1], row[2], row[3])
		}
	}
	if !strings.Contains(table, "events republished: 0.") {
		t.Errorf("restart republished events or did not report:\n%s", table)
	}
}
