package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/student-bridge/student-bridge/internal/stages"
)

// TestSmoke runs the whole harness briefly, so that `make bench` cannot rot:
// every variant runs, the bridge delivers every change, and the memory and
// restart phase reports that nothing was republished.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode")
	}
	var out bytes.Buffer
	dir := t.TempDir()
	err := bench(context.Background(), options{rates: []int{20}, duration: 2 * time.Second, reps: 1, students: []int{20, 40}, idle: time.Second, memorySettle: 2 * time.Second,
		out: filepath.Join(dir, "results.md")}, &out)
	if err != nil {
		t.Fatal(err)
	}
	table := out.String()
	// The charts of the run, next to its results.
	for file, want := range map[string]string{"latency.svg": "raw-informer", "memory.svg": "RSS, steady with memoryLimit", "restart.svg": "raw informer: synced"} {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil || !strings.Contains(string(b), "<svg") || !strings.Contains(string(b), want) {
			t.Errorf("%s: %v; want an SVG naming %q", file, err, want)
		}
	}
	t.Log("\n" + table)
	for _, v := range variants {
		row := regexp.MustCompile(`(?m)^\| ` + regexp.QuoteMeta(v.name) + ` \| 20 \| .*\| (\d+)/(\d+) \| (\d+) \| (\d+) \|`).FindStringSubmatch(table)
		if row == nil {
			t.Errorf("no row for %s", v.name)
			continue
		}
		covered, made, lost, unobserved := atoi(row[1]), atoi(row[2]), atoi(row[3]), atoi(row[4])
		// A Student created and deleted before the bridge saw it has two
		// changes that nothing covers; everything else must be covered.
		if covered == 0 || lost != 0 || covered+2*unobserved < made {
			t.Errorf("%s: covered %d of %d changes, lost %d final states, %d unobserved", v.name, covered, made, lost, unobserved)
		}
		// The finalizer policy holds every deleted Student for the bridge.
		if v.policy && unobserved != 0 {
			t.Errorf("%s: %d Students unobserved despite the finalizer policy", v.name, unobserved)
		}
	}
	// The bridge as deployed goes through every stage, each measured.
	if !regexp.MustCompile(`(?m)^\| student-bridge \| 20 \|( [\d.]+ / [\d.]+ \|){` + strconv.Itoa(len(stages.All)) + `}$`).MatchString(table) {
		t.Errorf("no stage latencies of every stage for student-bridge:\n%s", table)
	}
	if !strings.Contains(table, "student-bridge (two services) at 20/s: a service's receipt shows on the Student after p50") {
		t.Errorf("no receipt-to-status latency of the variant with services:\n%s", table)
	}
	if !strings.Contains(table, "With two services' receipts for each of the 35 Students (70 receipts)") {
		t.Errorf("no memory with receipts:\n%s", table)
	}
	if !regexp.MustCompile(`(?m)^\| student-bridge \| \d+ \(\d+-\d+\) \| [\d.]+x`).MatchString(table) {
		t.Errorf("no capacity of student-bridge against the raw informer:\n%s", table)
	}
	if !regexp.MustCompile(`(?m)^\| 3 replicas over 16 shards \| \d+ \| [\d.]+ \|$`).MatchString(table) {
		t.Errorf("no writes at rest of three replicas over shards:\n%s", table)
	}
	if !strings.Contains(table, "Events republished by the restarts with every Student published: 0.") {
		t.Errorf("restart republished events or did not report:\n%s", table)
	}
	// Three replicas, one killed: its shards' changes wait, the others not.
	if !regexp.MustCompile(`The other two restarted once \(as a rolling update would\), then one replica SIGKILLed, 10 Students of every shard changed at once: the changes of its \d+ shards published after [\d.]+m?s \(first\) to [\d.]+m?s \(last\)`).MatchString(table) {
		t.Errorf("no failover at scale:\n%s", table)
	}
	// Memory per count: publishing, after a restart and settled, without
	// and with the memory limit.
	mb, settledIn := `[\d.]+`, `\d+s( \(bound\))?`
	if !regexp.MustCompile(`(?m)^\| 40 \|( ` + mb + ` \|){5} ` + settledIn + ` \|( ` + mb + ` \|){3} ` + settledIn + ` \|$`).MatchString(table) {
		t.Errorf("no memory of 40 Students:\n%s", table)
	}
	// The restart's catch-up against a raw informer, per count: three of
	// each (the restarts' catch-ups too) against its process, one against
	// it in the bench's process.
	d, spread := `[\d.]+m?s`, `[\d.]+m?s \([\d.]+m?s-[\d.]+m?s\)`
	if !regexp.MustCompile(`(?m)^\| 38 \| ` + d + ` \| ` + spread + ` \| ` + spread + ` \| ` + spread + ` \| [\d.]+x \| ` + d + ` \| [\d.]+x \|$`).MatchString(table) {
		t.Errorf("no restart of 38 Students against the informer's sync:\n%s", table)
	}
	// Under load: the deletes made while the bridge was down published,
	// the live changes measured before and during the catch-up, when the
	// bridge could publish, and the raw informer process's start, which
	// must see changes made during it (at 200/s, dozens).
	if !regexp.MustCompile(`(?m)^\| 38 \| [\d.]+m?s \| [\d.]+m?s \| [\d.]+x \| 3, [\d.]+m?s after the start \| [\d.]+ / [\d.]+ \| [\d.]+ / [\d.]+ \(\d+ changes\) \| [\d.x-]+ \| [\d.]+m?s \| [\d.]+ / [\d.]+ \(\d+ changes\) \| [\d.x-]+ \| [\d.]+m?s \| [\d.]+ / [\d.]+ \([1-9]\d* changes\) \| [\d.]+x \|$`).MatchString(table) {
		t.Errorf("no restart under load of the 38 Students left, or a raw informer's start that saw none of the changes made during it:\n%s", table)
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
