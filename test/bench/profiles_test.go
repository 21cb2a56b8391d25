package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	pprofile "github.com/google/pprof/profile"
)

func TestCategoryIsTheWorkNotThePath(t *testing.T) {
	for _, c := range []struct {
		frames []string
		want   string
	}{
		// Innermost first: a write to NATS made by a reconcile is NATS's.
		{[]string{"syscall.Syscall", "github.com/nats-io/nats%2ego.(*Conn).flusher"}, "NATS: reservation, publish, record"},
		{[]string{"encoding/json.Marshal", "github.com/student-bridge/student-bridge/reconciler.(*StudentReconciler).publish"}, "reconcile and queue"},
		{[]string{"encoding/json.Marshal", "github.com/cloudevents/sdk-go/v2/event.Event.MarshalJSON", "github.com/student-bridge/student-bridge/reconciler.(*StudentReconciler).publish"}, "event built and encoded"},
		{[]string{"runtime.gcDrain", "runtime.gcAssistAlloc", "runtime.mallocgc", "github.com/nats-io/nats%2ego.NewMsg"}, "garbage collection"},
		{[]string{"runtime.futex", "runtime.findRunnable", "runtime.schedule"}, "scheduler, wake-ups and syscalls"},
		{[]string{"k8s.io/apimachinery/pkg/util/json.Unmarshal", "k8s.io/apimachinery/pkg/watch.(*StreamWatcher).receive"}, "watch events decoded, cache"},
		// controller-runtime's client: a Get reads the cache, a Patch or a
		// status update is a write.
		{[]string{"runtime.mapaccess2", "sigs.k8s.io/controller-runtime/pkg/cache.(*multiNamespaceCache).Get", "sigs.k8s.io/controller-runtime/pkg/client.(*client).Get",
			"github.com/student-bridge/student-bridge/reconciler.(*StudentReconciler).Reconcile"}, "watch events decoded, cache"},
		{[]string{"fmt.Sprintf", "k8s.io/apimachinery/pkg/api/errors.NewNotFound", "sigs.k8s.io/controller-runtime/pkg/client.(*client).Get",
			"github.com/student-bridge/student-bridge/reconciler.(*StudentReconciler).Reconcile"}, "watch events decoded, cache"},
		{[]string{"encoding/json.Marshal", "sigs.k8s.io/controller-runtime/pkg/client.createMergePatch", "sigs.k8s.io/controller-runtime/pkg/client.(*client).Patch"},
			"API server writes: finalizer, status, Events"},
		{[]string{"encoding/json.Marshal", "sigs.k8s.io/controller-runtime/pkg/client.(*typedClient).UpdateSubResource",
			"sigs.k8s.io/controller-runtime/pkg/client.(*subResourceClient).Update"}, "API server writes: finalizer, status, Events"},
		{[]string{"main.main"}, otherCategory},
	} {
		if got := category(c.frames); got != c.want {
			t.Errorf("category(%v) = %q, want %q", c.frames, got, c.want)
		}
	}
}

// writeProfile writes a profile of one sample type whose samples are
// the given stacks (innermost first) with the given values.
func writeProfile(t *testing.T, file, typ, unit string, stacks [][]string, values []int64) {
	t.Helper()
	p := &pprofile.Profile{SampleType: []*pprofile.ValueType{{Type: typ, Unit: unit}}}
	funcs := map[string]*pprofile.Function{}
	for i, stack := range stacks {
		var locs []*pprofile.Location
		for _, name := range stack {
			fn, ok := funcs[name]
			if !ok {
				fn = &pprofile.Function{ID: uint64(len(funcs) + 1), Name: name}
				funcs[name] = fn
				p.Function = append(p.Function, fn)
			}
			loc := &pprofile.Location{ID: uint64(len(p.Location) + 1), Line: []pprofile.Line{{Function: fn}}}
			p.Location = append(p.Location, loc)
			locs = append(locs, loc)
		}
		p.Sample = append(p.Sample, &pprofile.Sample{Location: locs, Value: []int64{values[i]}})
	}
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := p.Write(f); err != nil {
		t.Fatal(err)
	}
}

func TestProfileSummarisedPerChange(t *testing.T) {
	dir := t.TempDir()
	cpu, allocs := filepath.Join(dir, "cpu.pb.gz"), filepath.Join(dir, "allocs.pb.gz")
	nats := []string{"github.com/nats-io/nats%2ego.(*Conn).publish"}
	sched := []string{"runtime.schedule"}
	// 0.3 s of NATS and 0.1 s of the scheduler; 600 and 200 objects.
	writeProfile(t, cpu, "cpu", "nanoseconds", [][]string{nats, sched, nats}, []int64{2e8, 1e8, 1e8})
	writeProfile(t, allocs, "alloc_objects", "count", [][]string{nats, sched}, []int64{600, 200})
	p, err := summarise(0, 5, cpu, allocs)
	if err != nil {
		t.Fatal(err)
	}
	if p.CPUSeconds < 0.399 || p.CPUSeconds > 0.401 || p.Allocs != 800 {
		t.Fatalf("totals %.3f s and %d allocs, want 0.4 s and 800", p.CPUSeconds, p.Allocs)
	}
	// A repetition of 10 s that made 1,000 changes, profiled for 5 s:
	// 500 changes, so 600 µs and 1.6 allocs per change.
	res := Results{Duration: "10s", Cells: []Cell{{Variant: "student-bridge (process)", Rate: 100, Reps: []Rep{{Made: 1000, Profiles: []Profile{p}}}}}}
	table, err := profileTable(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| NATS: reservation, publish, record | 75 % (600 µs) | 75 % (1) |",
		"| scheduler, wake-ups and syscalls | 25 % (200 µs) | 25 % (0) |",
		"| **per change** | **800 µs** | **2** |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("the table has no line %q:\n%s", want, table)
		}
	}
	if _, err := profileTable(Results{Duration: "10s"}); err == nil {
		t.Error("a run without profiles renders a profile table")
	}
}
