package kubeevents_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/kubeevents"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

var st *stack.Stack

func TestMain(m *testing.M) {
	kubeevents.RegisterMetrics()
	os.Exit(stacktest.RunTests(m, stack.Options{}, func(s *stack.Stack) { st = s }))
}

// student creates a Student in a namespace of its own.
func student(t *testing.T) *studentv1.Student {
	t.Helper()
	ctx := context.Background()
	ns := stacktest.Namespace(t, st.Client, strings.ToLower(t.Name()))
	s := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "wang"}, Spec: studentv1.StudentSpec{Name: "wang", School: "china"}}
	if err := st.Client.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	return s
}

func newRecorder(t *testing.T, opts kubeevents.Options) *kubeevents.Recorder {
	t.Helper()
	opts.Controller = "student-bridge"
	opts.Log = ctrl.Log
	r, err := kubeevents.New(st.Client, st.Client.Scheme(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// start runs r until the test ends.
func start(t *testing.T, r *kubeevents.Recorder) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = r.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// waitEvents waits until namespace ns holds exactly n Events and returns them.
func waitEvents(t *testing.T, ns string, n int) []eventsv1.Event {
	t.Helper()
	var list eventsv1.EventList
	err := stacktest.Eventually(30*time.Second, func() error {
		if err := st.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return err
		}
		if len(list.Items) != n {
			return fmt.Errorf("%d Events, want %d", len(list.Items), n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func counter(t *testing.T, result string) float64 {
	t.Helper()
	v, err := stacktest.Counter("student_bridge_kubernetes_events_total", "result", result)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestEventsAreWrittenOnTheStudent(t *testing.T) {
	s := student(t)
	r := newRecorder(t, kubeevents.Options{QPS: 100})
	start(t, r)
	long := strings.Repeat("x", 2000)
	r.Eventf(s, nil, corev1.EventTypeNormal, studentv1.ReasonPublished, "Publish", "published %s", "id-1")
	r.Eventf(s, nil, corev1.EventTypeWarning, studentv1.ReasonPublishFailed, "Publish", "failed: %s", long)

	got := map[string]eventsv1.Event{}
	for _, e := range waitEvents(t, s.Namespace, 2) {
		got[e.Type] = e
	}
	n, w := got[corev1.EventTypeNormal], got[corev1.EventTypeWarning]
	if n.Reason != studentv1.ReasonPublished || n.Action != "Publish" || n.Note != "published id-1" {
		t.Errorf("Normal Event: reason %q action %q note %q", n.Reason, n.Action, n.Note)
	}
	for _, e := range []eventsv1.Event{n, w} {
		if e.Regarding.Kind != "Student" || e.Regarding.APIVersion != "example.k8s.io/v1" || e.Regarding.Name != s.Name || e.Regarding.UID != s.UID {
			t.Errorf("%s Event regards %+v, want the Student %s", e.Type, e.Regarding, s.UID)
		}
		if e.ReportingController != "student-bridge" || !strings.HasPrefix(e.ReportingInstance, "student-bridge-") || e.EventTime.IsZero() {
			t.Errorf("%s Event: reportingController %q, reportingInstance %q, eventTime %v", e.Type, e.ReportingController, e.ReportingInstance, e.EventTime)
		}
	}
	if w.Reason != studentv1.ReasonPublishFailed || len(w.Note) != 1024 || !strings.HasSuffix(w.Note, "...") {
		t.Errorf("Warning Event: reason %q, note of %d bytes ending %q; want the note cut to the API server's 1024 bytes", w.Reason, len(w.Note), w.Note[len(w.Note)-5:])
	}
}

// A full queue drops its oldest Events, and counts them, instead of
// blocking the caller: the newest are written once the writers run.
func TestFullQueueDropsInsteadOfBlocking(t *testing.T) {
	s := student(t)
	r := newRecorder(t, kubeevents.Options{QPS: 100, QueueSize: 10})
	dropped, written := counter(t, "dropped"), counter(t, "written")
	for i := range 100 {
		r.Eventf(s, nil, corev1.EventTypeNormal, studentv1.ReasonPublished, "Publish", "event %d", i)
	}
	if d := counter(t, "dropped") - dropped; d != 90 {
		t.Fatalf("dropped %v Events, want 90 (queue of 10, none written yet)", d)
	}
	start(t, r)
	events := waitEvents(t, s.Namespace, 10)
	seen := map[string]bool{}
	for _, e := range events {
		seen[e.Note] = true
	}
	for i := 90; i < 100; i++ {
		if !seen[fmt.Sprintf("event %d", i)] {
			t.Errorf("the newest \"event %d\" was not written; got %v", i, seen)
		}
	}
	if err := stacktest.Eventually(10*time.Second, func() error {
		if w := counter(t, "written") - written; w != 10 {
			return fmt.Errorf("written counter moved by %v, want 10", w)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

func TestQPSMustBePositive(t *testing.T) {
	if _, err := kubeevents.New(st.Client, st.Client.Scheme(), kubeevents.Options{Controller: "x"}); err == nil || !strings.Contains(err.Error(), "QPS") {
		t.Fatalf("New without QPS: %v, want an error naming QPS", err)
	}
}

// While the caller is busy Events wait (a writer holding one asks Busy
// until it says no); they are written once it is not.
func TestBusyCallerHoldsEvents(t *testing.T) {
	s := student(t)
	var busy atomic.Bool
	var asked atomic.Int64
	busy.Store(true)
	r := newRecorder(t, kubeevents.Options{QPS: 100, Busy: func() bool { asked.Add(1); return busy.Load() }})
	start(t, r)
	for i := range 3 {
		r.Eventf(s, nil, corev1.EventTypeNormal, studentv1.ReasonPublished, "Publish", "event %d", i)
	}
	// A writer asks Busy once it holds an Event, before its write: asked
	// and told busy again and again, it held its Event back all along.
	if err := stacktest.Eventually(10*time.Second, func() error {
		if n := asked.Load(); n < 10 {
			return fmt.Errorf("the writers asked Busy %d times, want 10", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var list eventsv1.EventList
	if err := st.Client.List(context.Background(), &list, client.InNamespace(s.Namespace)); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Fatalf("%d Events written while the caller was busy", len(list.Items))
	}
	busy.Store(false)
	waitEvents(t, s.Namespace, 3)
}
