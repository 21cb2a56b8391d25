package bridge_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/queue"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/reconciler"
)

// TestCatchUpUnderLoad: a restart's catch-up (the watch's initial list,
// which controller-runtime queues below live changes) finishes while live
// changes keep every worker busy: the load runs until it has. Without the
// aging queue, which raises the catch-up once it waited
// queue.LowPriorityWait, it would wait for the load to end. How long it
// took is logged beside the same catch-up with nothing else to do, not
// bounded: the machine's load decides it. The quiet Students
// lose their finalizer while the bridge is down, so each needs a
// reconcile (the finalizer back) and none a publish: they are queued only
// by the initial list.
func TestCatchUpUnderLoad(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "catchup")
	// One worker, and NATS behind a link that delays what it carries: a
	// live change's publish and record take tens of milliseconds, so the
	// changes below arrive faster than the worker publishes them.
	cfg.Workers = 1
	link, err := stack.NewLink(strings.TrimPrefix(st.NATS.URL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(link.Close)
	cfg.NATS.URLs = "nats://" + link.Addr()

	const quiet, busy = 300, 30
	createStudents(t, ns, "s%d", quiet+busy)
	stop := startBridge(t, cfg)
	waitStream(t, natsConn(t), cfg.NATS.Stream.Name, quiet+busy)
	stop()

	dropFinalizers(t, ns, 0, quiet)
	idle := catchUpAfterStart(t, func() { stop = startBridge(t, cfg) }, 2*time.Minute)
	stop()
	t.Logf("catch-up of %d Students with nothing else to do: %s", quiet+busy, idle)

	link.SetDelay(10 * time.Millisecond)
	loadCtx, endLoad := context.WithCancel(ctx)
	var changes atomic.Int64
	loadDone := make(chan error, 1)
	go func() {
		for i := 0; loadCtx.Err() == nil; i++ {
			var s studentv1.Student
			err := st.Client.Get(loadCtx, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("s%d", quiet+i%busy)}, &s)
			if err == nil {
				s.Spec.School = fmt.Sprintf("school %d", i)
				err = st.Client.Update(loadCtx, &s)
			}
			if err != nil && loadCtx.Err() == nil && !apierrors.IsConflict(err) {
				loadDone <- err
				return
			}
			changes.Add(1)
			time.Sleep(5 * time.Millisecond) // the load's pace
		}
		loadDone <- nil
	}()
	dropFinalizers(t, ns, 0, quiet)
	// The load runs before the bridge starts: its queue holds live changes
	// from the first moment.
	stacktest.WaitFor(t, "the load under way", func() error {
		if n := changes.Load(); n < 2*busy {
			return fmt.Errorf("%d changes made, want %d", n, 2*busy)
		}
		return nil
	})
	// Live changes queued before the catch-up is raised to their
	// priority: at most one per busy Student.
	var deepest float64
	started := time.Now()
	loaded := catchUpAfterStart(t, func() { stop = startBridge(t, cfg) }, 3*time.Minute, func() {
		if time.Since(started) < queue.LowPriorityWait {
			deepest = max(deepest, gauge(t, "workqueue_depth", "priority", "0"))
		}
	})
	endLoad()
	if err := <-loadDone; err != nil {
		t.Fatalf("the load: %v", err)
	}
	t.Logf("catch-up under %d live changes: %s (with nothing else to do %s); live changes queued at most: %.0f", changes.Load(), loaded, idle, deepest)
	if deepest < 5 {
		t.Fatalf("the live changes did not keep the worker busy (at most %.0f queued): the test proves nothing", deepest)
	}
	stop()
}

// catchUpAfterStart calls start and returns how long the catch-up it
// causes took, as student_bridge_catch_up_duration_seconds observed it;
// sample runs while it waits.
func catchUpAfterStart(t *testing.T, start func(), timeout time.Duration, sample ...func()) time.Duration {
	t.Helper()
	count0, sum0 := histogram(t, "student_bridge_catch_up_duration_seconds")
	start()
	var took time.Duration
	if err := stacktest.Eventually(timeout, func() error {
		for _, f := range sample {
			f()
		}
		if count, sum := histogram(t, "student_bridge_catch_up_duration_seconds"); count > count0 {
			took = time.Duration((sum - sum0) * float64(time.Second))
			return nil
		}
		return fmt.Errorf("%d Students still queued by it", int(gauge(t, "student_bridge_catch_up_students")))
	}); err != nil {
		t.Fatalf("no catch-up ended within %s: %v", timeout, err)
	}
	return took
}

// dropFinalizers removes the bridge's finalizer from the Students s<from>
// to s<to-1> of ns, as someone might while no bridge runs.
func dropFinalizers(t *testing.T, ns string, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		s := getStudent(t, ns, fmt.Sprintf("s%d", i))
		patch(t, s, func(s *studentv1.Student) { controllerutil.RemoveFinalizer(s, studentv1.Finalizer) })
	}
}

// TestRestartReconcilesOnlyWhatChanged: a restart with every Student
// published reconciles only those that changed while no bridge ran, or
// lost the finalizer; the others' status is still brought up to date.
func TestRestartReconcilesOnlyWhatChanged(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "unchanged")
	const n = 20
	createStudents(t, ns, "s%d", n)
	stop := startBridge(t, cfg)
	nc := natsConn(t)
	waitStream(t, nc, cfg.NATS.Stream.Name, n)
	if err := stacktest.Eventually(30*time.Second, func() error {
		if c := meta.FindStatusCondition(getStudent(t, ns, "s4").Status.Conditions, studentv1.ConditionPublished); c == nil || c.Reason != studentv1.ReasonPublished {
			return fmt.Errorf("s4's Published condition is %+v", c)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	stop()

	// While no bridge runs: two Students change, one loses the
	// finalizer, one's status is cleared, and one's Published message is
	// edited (the cache holds that message only where it says what
	// lastPublished does, so an edited one must still be seen).
	for _, name := range []string{"s0", "s1"} {
		patch(t, getStudent(t, ns, name), func(s *studentv1.Student) { s.Spec.School = "tsinghua" })
	}
	dropFinalizers(t, ns, 2, 3)
	cleared := getStudent(t, ns, "s3")
	cleared.Status = studentv1.StudentStatus{}
	if err := st.Client.Status().Update(ctx, cleared); err != nil {
		t.Fatal(err)
	}
	edited := getStudent(t, ns, "s4")
	published := meta.FindStatusCondition(edited.Status.Conditions, studentv1.ConditionPublished)
	want := published.Message
	published.Message = "edited by hand"
	if err := st.Client.Status().Update(ctx, edited); err != nil {
		t.Fatal(err)
	}

	before := reconciles(t)
	catchUpAfterStart(t, func() { stop = startBridge(t, cfg) }, time.Minute)
	waitStream(t, nc, cfg.NATS.Stream.Name, n+2)
	if err := stacktest.Eventually(30*time.Second, func() error {
		for _, name := range []string{"s2", "s3"} {
			s := getStudent(t, ns, name)
			switch {
			case !controllerutil.ContainsFinalizer(s, studentv1.Finalizer):
				return fmt.Errorf("%s has no finalizer", name)
			case s.Status.LastPublished == nil || s.Status.ObservedGeneration != s.Generation:
				return fmt.Errorf("%s shows status %+v", name, s.Status)
			}
		}
		if c := meta.FindStatusCondition(getStudent(t, ns, "s4").Status.Conditions, studentv1.ConditionPublished); c == nil || c.Message != want {
			return fmt.Errorf("s4's Published condition is %+v, want the message %q back", c, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := reconciles(t) - before; got < 3 || got >= n {
		t.Errorf("the restart made %.0f reconciles, want one for each of the 3 Students that needed one, not one for every Student", got)
	}

	// Nothing changed: nothing to reconcile, and the start's catch-up
	// still ends (its workers asked for work and got none).
	stop()
	before = reconciles(t)
	catchUpAfterStart(t, func() { startBridge(t, cfg) }, time.Minute)
	if got := reconciles(t) - before; got != 0 {
		t.Errorf("a restart with nothing changed made %.0f reconciles, want 0", got)
	}
}

// TestRestartOverTwoNamespaces: a bridge that watches two namespaces finds
// at its restart what changed and what is gone in either, and reconciles
// only those: the Students of the other namespace are neither taken for
// gone nor reconciled again.
func TestRestartOverTwoNamespaces(t *testing.T) {
	ctx := context.Background()
	first, second := newNamespace(t), newNamespace(t)
	cfg := testConfig(t, first, "twons")
	cfg.Namespaces = []string{first, second}
	const n = 10 // Students in each namespace
	for _, ns := range cfg.Namespaces {
		for i := range n {
			if err := st.Client.Create(ctx, newStudent(ns, fmt.Sprintf("s%d", i), "wang", "china")); err != nil {
				t.Fatal(err)
			}
		}
	}
	stop := startBridge(t, cfg)
	nc := natsConn(t)
	waitStream(t, nc, cfg.NATS.Stream.Name, 2*n)
	stop()

	// While no bridge runs: a Student of the second namespace changes,
	// and one of the first is deleted without the bridge's finalizer.
	patch(t, getStudent(t, second, "s0"), func(s *studentv1.Student) { s.Spec.School = "tsinghua" })
	dropFinalizers(t, first, 1, 2)
	if err := st.Client.Delete(ctx, getStudent(t, first, "s1")); err != nil {
		t.Fatal(err)
	}

	before := reconciles(t)
	catchUpAfterStart(t, func() { startBridge(t, cfg) }, time.Minute)
	got := waitStream(t, nc, cfg.NATS.Stream.Name, 2*n+2)
	want := map[string]string{second + "/s0": studentv1.EventTypeUpdated, first + "/s1": studentv1.EventTypeDeleted}
	for _, r := range got[2*n:] {
		key := r.Data.Metadata.Namespace + "/" + r.Data.Metadata.Name
		if want[key] != r.Event.Type() {
			t.Errorf("the restart published %s for %s, want only %v", r.Event.Type(), key, want)
		}
	}
	if got := reconciles(t) - before; got >= n {
		t.Errorf("the restart made %.0f reconciles, want one for each of the 2 Students that needed one, not one for every Student of a namespace", got)
	}
}

// TestPublishingStartsOnceTheRecordsLoad:
// student_bridge_publishing_start_time_seconds says when a bridge could
// first publish. Not when its workers start, if they wait for the record
// store then, but once the records are loaded. The start's catch-up ends
// after it (student_bridge_catch_up_end_time_seconds).
func TestPublishingStartsOnceTheRecordsLoad(t *testing.T) {
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "pubstart")
	link, err := stack.NewLink(strings.TrimPrefix(st.NATS.URL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(link.Close)
	link.Cut()
	cfg.NATS.URLs = "nats://" + link.Addr()
	if err := st.Client.Create(context.Background(), newStudent(ns, "a", "wang", "china")); err != nil {
		t.Fatal(err)
	}
	const since = "student_bridge_publishing_start_time_seconds"
	before := gauge(t, since)
	startBridge(t, cfg)

	// The cache synced and a worker took the Student: its reconcile waits
	// for the records, which cannot load without NATS.
	if err := stacktest.Eventually(30*time.Second, func() error {
		if n := gauge(t, "controller_runtime_active_workers", "controller", reconciler.ControllerName); n < 1 {
			return fmt.Errorf("%.0f workers active, want 1 waiting for the records", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := gauge(t, since); got != before {
		t.Fatalf("%s moved to %.3f while the records could not load", since, got)
	}
	healed := time.Now()
	link.Heal()
	waitStream(t, natsConn(t), cfg.NATS.Stream.Name, 1)
	if got := gauge(t, since); got < float64(healed.UnixNano())/1e9 {
		t.Errorf("%s is %.3f, before NATS came back at %.3f", since, got, float64(healed.UnixNano())/1e9)
	}
	// The start's catch-up ends with that Student published: after.
	const caughtUp = "student_bridge_catch_up_end_time_seconds"
	if err := stacktest.Eventually(30*time.Second, func() error {
		if end, pub := gauge(t, caughtUp), gauge(t, since); end < pub {
			return fmt.Errorf("%s is %.3f, before the bridge could publish at %.3f", caughtUp, end, pub)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// histogram is the sample count and sum of the histogram name in this
// process's controller-runtime registry.
func histogram(t *testing.T, name string) (uint64, float64) {
	h := metricOf(t, name).GetHistogram()
	return h.GetSampleCount(), h.GetSampleSum()
}

// gauge is the value of the gauge name (with label=value, if given).
func gauge(t *testing.T, name string, labelValue ...string) float64 {
	return metricOf(t, name, labelValue...).GetGauge().GetValue()
}

func metricOf(t *testing.T, name string, labelValue ...string) *dto.Metric {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if len(labelValue) < 2 {
				return m
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == labelValue[0] && l.GetValue() == labelValue[1] {
					return m
				}
			}
		}
	}
	return &dto.Metric{}
}
