package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
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
		counts: []int{10}, out: filepath.Join(dir, "results.md")}, &out)
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
	// The load phase as data: every variant's cell, each repetition.
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res Results
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if res.Machine.CPUs == 0 || res.Date == "" || res.Command == "" || res.Reps != 1 {
		t.Errorf("the results do not say where, when and how they ran: %+v", res)
	}
	cells := map[string]Cell{}
	for _, c := range res.Cells {
		cells[c.Variant] = c
	}
	for _, v := range variants {
		c, ok := cells[v.name]
		if !ok || c.Rate != 20 || len(c.Reps) != 1 {
			t.Errorf("%s: no cell of one repetition at 20/s: %+v", v.name, c)
			continue
		}
		r := c.Reps[0]
		// A Student created and deleted before the bridge saw it has two
		// changes that nothing covers; everything else must be covered.
		if r.Covered == 0 || r.LostFinal != 0 || r.Covered+2*r.Unobserved < r.Made {
			t.Errorf("%s: covered %d of %d changes, lost %d final states, %d unobserved", v.name, r.Covered, r.Made, r.LostFinal, r.Unobserved)
		}
		// The finalizer policy holds every deleted Student for the bridge.
		if v.policy && r.Unobserved != 0 {
			t.Errorf("%s: %d Students unobserved despite the finalizer policy", v.name, r.Unobserved)
		}
		if r.Drained <= 0 {
			t.Errorf("%s: drained %v changes/s", v.name, r.Drained)
		}
	}
	// The bridge as deployed goes through every stage, each measured.
	for _, s := range stages.All {
		if h := cells["student-bridge"].Reps[0].Stages[s]; h.Count == 0 {
			t.Errorf("student-bridge: no %s stage observed", s)
		}
	}
	checkCounts(t, res.Counts)
	// The tables are the data's: rendered again from the file, they are
	// the run's.
	tables, err := render(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(table, tables) {
		t.Errorf("the load tables rendered from results.json differ from the run's:\n%s", tables)
	}
	if !strings.Contains(table, "student-bridge (two services) at 20/s: a service's receipt shows on the Student after p50") {
		t.Errorf("no receipt-to-status latency of the variant with services:\n%s", table)
	}
	if !strings.Contains(table, "With two services' receipts for each of the 35 Students (70 receipts)") {
		t.Errorf("no memory with receipts:\n%s", table)
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

// checkCounts checks the counts phase: every operation counted; a create
// costs no more JetStream requests than its write-ahead record, its event
// and its record, an update no more than the event and the record, a
// delete no more than the event, the record and its removal; and what the
// bridges counted is what the servers counted.
func checkCounts(t *testing.T, c *Counts) {
	t.Helper()
	if c == nil {
		t.Fatal("the results have no counts")
	}
	byOp := map[string]CountRow{}
	for _, row := range c.Rows {
		byOp[row.Operation] = row
	}
	for op, most := range map[string]float64{"create": 3, "update": 2, "delete": 3} {
		row, ok := byOp[op]
		if !ok || row.Changes == 0 {
			t.Errorf("no %s counted: %+v", op, c.Rows)
			continue
		}
		n, total := float64(row.Changes), 0.0
		for _, v := range row.JetStream {
			total += v
		}
		if row.JetStream["publish"] != n || total > most*n {
			t.Errorf("%s: JetStream requests %v for %v changes; want one publish each and at most %v requests each", op, row.JetStream, n, most)
		}
		if row.NATSSent != row.NATSServer || row.NATSSent == 0 {
			t.Errorf("%s: the bridges sent %v NATS messages, the server received %v from them", op, row.NATSSent, row.NATSServer)
		}
		// Leases are the API server's own too; a watch it counts when the
		// watch ends.
		for _, m := range []map[string]float64{row.API, row.APIServer} {
			for k := range m {
				if !strings.HasSuffix(k, " leases") && !strings.HasPrefix(k, "watch ") && row.API[k] != row.APIServer[k] {
					t.Errorf("%s: %s: the bridges counted %v requests, the API server %v", op, k, row.API[k], row.APIServer[k])
				}
			}
		}
	}
	if byOp["delete"].API["patch students"] != float64(byOp["delete"].Changes) {
		t.Errorf("delete: %v; want one finalizer removal per delete", byOp["delete"].API)
	}
	// The survivors of a handover, and a replica that rejoins, load the
	// records of the shards they gain.
	for _, op := range []string{"handover", "rejoin"} {
		if byOp[op].JetStream["load"] == 0 {
			t.Errorf("%s: no record load among %v", op, byOp[op].JetStream)
		}
	}
	if _, ok := byOp["rest"]; !ok {
		t.Errorf("nothing counted at rest: %+v", c.Rows)
	}
}
