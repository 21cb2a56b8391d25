package statusview_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/internal/stages"
	"github.com/student-bridge/student-bridge/reconciler/statusview"
)

var st *stack.Stack

func TestMain(m *testing.M) {
	stages.RegisterMetrics()
	statusview.RegisterMetrics()
	os.Exit(stacktest.RunTests(m, stack.Options{}, func(s *stack.Stack) { st = s }))
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
	view := func(s *studentv1.Student) studentv1.StudentStatus {
		return studentv1.StudentStatus{Conditions: []metav1.Condition{{Type: studentv1.ConditionPublished, Status: metav1.ConditionFalse,
			Reason: "Pending", Message: "asked for by the test", LastTransitionTime: metav1.Now(), ObservedGeneration: s.Generation}}}
	}
	w := statusview.NewWriter(st.Client, view, 100, nil, logr.Discard())
	count, sum := statusStage(t)

	const behind = 500 * time.Millisecond
	w.Enqueue(types.NamespacedName{Namespace: ns, Name: "waits"})
	time.Sleep(behind)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the status writer: %v", err)
		}
	}()
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
