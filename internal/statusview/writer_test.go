package statusview_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/internal/stages"
	"github.com/student-bridge/student-bridge/internal/statusview"
)

var st *stack.Stack

func TestMain(m *testing.M) {
	stages.RegisterMetrics()
	statusview.RegisterMetrics()
	os.Exit(stacktest.RunTests(m, stack.Options{}, func(s *stack.Stack) { st = s }))
}

// start runs w until the test ends.
func start(t *testing.T, w *statusview.Writer) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the status writer: %v", err)
		}
	})
}

// notPublished is a view of every Student as not published, for reason.
func notPublished(reason, message string) func(*studentv1.Student) studentv1.StudentStatus {
	return func(s *studentv1.Student) studentv1.StudentStatus {
		return studentv1.StudentStatus{Conditions: []metav1.Condition{{Type: studentv1.ConditionPublished, Status: metav1.ConditionFalse,
			Reason: reason, Message: message, LastTransitionTime: metav1.Now(), ObservedGeneration: s.Generation}}}
	}
}

// statusStage returns how many status writes the status stage observed,
// and their total seconds.
func statusStage(t *testing.T) (uint64, float64) {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "student_bridge_stage_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			if label(m, "stage") == stages.Status {
				return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
			}
		}
	}
	t.Fatal("no status stage exported")
	return 0, 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestStatusStageFromAsked: the status stage runs from when a Student's
// status was asked for, not from when the writer got to it: a writer that
// starts a while after the ask (as one waits behind a backlog) counts
// that while.
func TestStatusStageFromAsked(t *testing.T) {
	ctx := context.Background()
	ns := stacktest.Namespace(t, st.Client, "writer")
	if err := st.Client.Create(ctx, &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "waits"},
		Spec: studentv1.StudentSpec{Name: "waits", School: "china"}}); err != nil {
		t.Fatal(err)
	}
	w := statusview.NewWriter(st.Client, notPublished("Pending", "asked for by the test"), statusview.WriterOptions{QPS: 100, Log: logr.Discard()})
	count, sum := statusStage(t)

	const behind = 500 * time.Millisecond
	w.Enqueue(types.NamespacedName{Namespace: ns, Name: "waits"})
	time.Sleep(behind) // the time asked before the writer runs, which the stage must include
	start(t, w)
	stacktest.WaitFor(t, "the status written", func() error {
		var got studentv1.Student
		if err := st.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "waits"}, &got); err != nil {
			return err
		}
		if c := got.Status.Conditions; len(c) != 1 || c[0].Message != "asked for by the test" {
			return fmt.Errorf("conditions %+v", c)
		}
		return nil
	})
	n, total := statusStage(t)
	if n != count+1 {
		t.Fatalf("the status stage observed %d writes, want 1", n-count)
	}
	if took := time.Duration((total - sum) * float64(time.Second)); took < behind {
		t.Errorf("the status stage took %s, less than the %s the write waited since it was asked for", took, behind)
	}
}

// TestFailingViewsKeepTheBudget: a failing view skips the wait for the
// changes in flight, not the status.qps budget (docs/scaling.md), so an
// outage that fails every Student does not turn into a burst of status
// writes: eight failing Students at 2 writes a second take at least the
// 3.5 s the budget spaces seven intervals by.
func TestFailingViewsKeepTheBudget(t *testing.T) {
	ctx := context.Background()
	ns := stacktest.Namespace(t, st.Client, "budget")
	const students, qps = 8, 2.0
	var keys []types.NamespacedName
	for i := range students {
		name := fmt.Sprintf("s%d", i)
		if err := st.Client.Create(ctx, &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: studentv1.StudentSpec{Name: name, School: "china"}}); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, types.NamespacedName{Namespace: ns, Name: name})
	}
	base, err := client.NewWithWatch(st.RestConfig, client.Options{Scheme: st.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var written []time.Time
	c := interceptor.NewClient(base, interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			err := c.SubResource(sub).Update(ctx, obj, opts...)
			if err == nil && obj.GetNamespace() == ns {
				mu.Lock()
				written = append(written, time.Now())
				mu.Unlock()
			}
			return err
		},
	})
	busy := func() bool { return true } // changes always wait: a failing view writes anyway
	w := statusview.NewWriter(c, notPublished("PublishFailed", "NATS is down"), statusview.WriterOptions{QPS: qps, Busy: busy, Log: logr.Discard()})
	for _, k := range keys {
		w.Enqueue(k)
	}
	start(t, w)
	stacktest.WaitFor(t, "every failing status written", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(written) < students {
			return fmt.Errorf("%d of %d written", len(written), students)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	// The limiter's burst is 1: n writes span at least n-1 intervals (a
	// little slack for the token bucket's clock).
	if span, least := written[len(written)-1].Sub(written[0]), time.Duration(float64(students-1)/qps*float64(time.Second))*9/10; span < least {
		t.Errorf("%d failing status writes within %s, want them spread over at least %s by status.qps %v", len(written), span.Round(time.Millisecond), least, qps)
	}
}
