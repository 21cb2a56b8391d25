package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/student-bridge/student-bridge/internal/stages"
)

// TestSmoke runs the whole harness briefly, so that `make bench` cannot rot:
// every variant runs, the bridge delivers every change, each operation's
// counts are within the bounds, and the memory, restart and
// failover phases measured every point and republished nothing. It reads
// what it checks from the run's results file, whose tables are the run's.
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
		if r.APICallP99ms <= 0 {
			t.Errorf("%s: the changes' API calls not measured (p99 %v ms)", v.name, r.APICallP99ms)
		}
	}
	// Each variant's capacity: 20/s, the grid's top (so a lower bound),
	// or none if a repetition this short missed the bound.
	if len(res.Capacity) != len(variants) {
		t.Errorf("capacity of %d variants, want %d: %+v", len(res.Capacity), len(variants), res.Capacity)
	}
	for _, c := range res.Capacity {
		if (c.Rate != 20 || !c.AtTop) && (c.Rate != 0 || c.AtTop) {
			t.Errorf("%s: capacity %+v, want at least 20/s or none", c.Variant, c)
		}
	}
	// The bridge as deployed goes through every stage, each measured. But
	// the finalizer is patched only when a Student is deleted (the policy
	// adds it at creation), and a repetition this short may delete none:
	// the generator creates instead while the Students it picks are busy,
	// as they are when the API server is slow. That stage is looked for
	// in every variant of the bridge that holds with a finalizer.
	for _, s := range stages.All {
		observed := cells["student-bridge"].Reps[0].Stages[s].Count > 0
		for _, v := range variants {
			if c := cells[v.name]; !observed && s == stages.Finalizer && v.policy && len(c.Reps) > 0 {
				observed = c.Reps[0].Stages[s].Count > 0
			}
		}
		if !observed {
			t.Errorf("student-bridge: no %s stage observed", s)
		}
	}
	checkCounts(t, res.Counts)
	// The tables are the data's: rendered again from the file, they are
	// the run's.
	if res.Scale == nil {
		t.Fatal("the results have no memory, restart and failover phases")
	}
	for _, part := range []string{loadTables(res), countsTable(*res.Counts), scaleTables(*res.Scale)} {
		if !strings.Contains(table, part) {
			t.Errorf("a table rendered from results.json is not the run's:\n%s", part)
		}
	}
	if !strings.Contains(table, "student-bridge (two services) at 20/s: a service's receipt shows on the Student after p50") {
		t.Errorf("no receipt-to-status latency of the variant with services:\n%s", table)
	}
	checkScale(t, *res.Scale, []int{20, 40})
}

// checkScale checks the memory, restart and failover phases of a run at
// counts of Students: memory measured at each point, with and without
// the memory limit; each restart against the informer's sync, as many of
// each as the table says; a restart under load that published the deletes
// made while it was down, measured the live changes, and started a raw
// informer that saw changes made during its list; nothing republished by
// a restart; every receipt read; and the failover's killed shards
// published by the survivors.
func checkScale(t *testing.T, s Scale, counts []int) {
	t.Helper()
	if s.Rest.RSSMB <= 0 || s.Rest.HeapMB <= 0 {
		t.Errorf("no memory of the process at rest: %+v", s.Rest)
	}
	if len(s.Counts) != len(counts) {
		t.Fatalf("%d counts of Students measured, want %v", len(s.Counts), counts)
	}
	live, created := 0, 0 // Students left: restarts under load delete some
	for i, c := range s.Counts {
		if c.Students != counts[i] {
			t.Errorf("count %d: %d Students, want %d", i, c.Students, counts[i])
		}
		for what, m := range map[string]Memory{"publishing": c.Publishing, "after a restart": c.AfterRestart, "steady": c.Steady,
			"after a restart, memoryLimit": c.AfterRestartLimited, "steady, memoryLimit": c.SteadyLimited} {
			if m.RSSMB <= 0 || m.HeapMB <= 0 {
				t.Errorf("%d Students: no memory %s: %+v", c.Students, what, m)
			}
		}
		if c.SettledMs <= 0 || c.SettledLimitedMs <= 0 {
			t.Errorf("%d Students: steady memory sampled after %v and %v ms", c.Students, c.SettledMs, c.SettledLimitedMs)
		}
		live, created = live+c.Students-created, c.Students
		r := c.Restart
		if r.Students != live {
			t.Errorf("%d Students: the restarts had %d, want the %d left", c.Students, r.Students, live)
		}
		for what, d := range map[string][]float64{"caught up": r.CaughtUpMs, "catch-up": r.CatchUpMs, "informer process": r.InformerProcessMs} {
			if len(d) != s.RestartReps || slices.Min(d) <= 0 || !slices.IsSorted(d) {
				t.Errorf("%d Students: restarts' %s %v; want %d, each measured, sorted", c.Students, what, d, s.RestartReps)
			}
		}
		if r.ReadyMs <= 0 || r.InformerMs <= 0 {
			t.Errorf("%d Students: ready after %v ms, the informer in this process synced after %v ms", c.Students, r.ReadyMs, r.InformerMs)
		}
		l := c.UnderLoad
		if l.Students != live || l.Deletes != min(s.LoadDeletes, live/10) || l.Deletes == 0 || l.DeletesPublishedMs <= 0 {
			t.Errorf("%d Students: restart under load of %d Students published %d deletes after %v ms; want %d, of the %d left",
				c.Students, l.Students, l.Deletes, l.DeletesPublishedMs, min(s.LoadDeletes, live/10), live)
		}
		if l.IdleCatchUpMs != r.CatchUpMs[len(r.CatchUpMs)/2] || l.CatchUpMs <= 0 || l.CouldPublishMs <= 0 {
			t.Errorf("%d Students: catch-up %v ms under load against %v idle (the restarts' median %v), could publish after %v ms",
				c.Students, l.CatchUpMs, l.IdleCatchUpMs, r.CatchUpMs, l.CouldPublishMs)
		}
		// At 200 changes/s, a raw informer's list sees dozens made
		// during it.
		if l.Steady.N == 0 || l.InformerDuring.N == 0 || l.InformerSyncedMs <= 0 {
			t.Errorf("%d Students: %d live changes measured before the stop, %d during the raw informer's start (synced after %v ms)",
				c.Students, l.Steady.N, l.InformerDuring.N, l.InformerSyncedMs)
		}
		live -= l.Deletes
	}
	if s.Republished != 0 {
		t.Errorf("the restarts with every Student published republished %d events", s.Republished)
	}
	rc := s.Receipts
	if rc.Students != live || rc.Receipts != len(benchServices)*live || rc.Read.RSSMB <= 0 || rc.Steady.RSSMB <= 0 {
		t.Errorf("receipts: %+v; want %d for each of %d Students, memory measured", rc, len(benchServices), live)
	}
	f := s.Failover
	if f.Students != live || len(f.Replicas) != 3 || f.PublishedMs <= 0 {
		t.Errorf("failover of %d Students by %d replicas, published after %v ms; want the %d left, 3 replicas", f.Students, len(f.Replicas), f.PublishedMs, live)
	}
	if f.PerShard != failoverPerShard || f.MovedShards == 0 || f.MovedFirstMs <= 0 || f.MovedLastMs < f.MovedFirstMs || f.Loads == 0 {
		t.Errorf("failover: %+v; want the killed replica's shards moved, their changes published, the gained shards loaded", f)
	}
}

// checkCounts checks the counts phase: every operation counted; a change
// costs no more JetStream requests than its reservation, its event and
// its record, a delete no more than those and its record's removal; and
// what the bridges counted is what the servers counted.
func checkCounts(t *testing.T, c *Counts) {
	t.Helper()
	if c == nil {
		t.Fatal("the results have no counts")
	}
	byOp := map[string]CountRow{}
	for _, row := range c.Rows {
		byOp[row.Operation] = row
	}
	for op, most := range map[string]float64{"create": 3, "update": 3, "delete": 4} {
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
		// The server's Lease writes include its own identity Lease's, and
		// it counts a watch when the watch ends (docs/guarantees.md says
		// why the other rows differ).
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
