package bridge_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// TestRestartRepublishesNothing: a new bridge on the same cluster and stream
// finds everything already published and sends nothing, on one NATS server
// and on a three-node cluster. A core subscriber counts: the stream's
// duplicate window would hide a republish with the same id.
func TestRestartRepublishesNothing(t *testing.T) {
	t.Run("one server", func(t *testing.T) {
		cfg := testConfig(t, newNamespace(t), "restart")
		testRestartRepublishesNothing(t, cfg, natsConn(t))
	})
	t.Run("cluster", func(t *testing.T) {
		cfg := testConfig(t, newNamespace(t), "restart")
		_, nc := onCluster(t, cfg)
		testRestartRepublishesNothing(t, cfg, nc)
	})
}

func testRestartRepublishesNothing(t *testing.T, cfg *config.Config, nc *nats.Conn) {
	ctx := context.Background()
	ns := cfg.Namespaces[0]
	stop := startBridge(t, cfg)

	const n = 10
	for i := range n {
		if err := st.Client.Create(ctx, newStudent(ns, fmt.Sprintf("s%d", i), "name", "school")); err != nil {
			t.Fatal(err)
		}
	}
	waitStream(t, nc, cfg.NATS.Stream.Name, n)
	patch(t, getStudent(t, ns, "s0"), func(s *studentv1.Student) { s.Spec.School = "other" })
	waitStream(t, nc, cfg.NATS.Stream.Name, n+1)
	stacktest.WaitFor(t, "every status written", func() error {
		for i := range n {
			s := getStudent(t, ns, fmt.Sprintf("s%d", i))
			if c := publishedCondition(s); c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != s.Generation {
				return fmt.Errorf("%s: %+v", s.Name, c)
			}
		}
		return nil
	})
	stop()

	sub, err := stacktest.Subscribe(nc, "restart.>")
	if err != nil {
		t.Fatal(err)
	}
	startBridge(t, cfg)
	// Barrier: a change made after the restart is the only new event.
	patch(t, getStudent(t, ns, "s1"), func(s *studentv1.Student) { s.Spec.School = "barrier" })
	got := waitStream(t, nc, cfg.NATS.Stream.Name, n+2)
	if last := got[len(got)-1]; last.Data.Spec.School != "barrier" {
		t.Errorf("last event after restart is %s %+v, want only the barrier change", last.Event.Type(), last.Data)
	}
	seen, err := sub.Events()
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 || seen[0].Data.Spec.School != "barrier" {
		t.Errorf("after the restart a core subscriber saw %v, want only the barrier change", types(seen))
	}
}

// TestRetriedAtOnceWhenNATSIsBack: the Students whose publish failed while
// NATS was down wait on a backoff that doubled with each failure; the
// first change published once NATS is back queues them again at once. The
// retry delay is two minutes here, so nothing but that publishes them
// within the test's wait.
func TestRetriedAtOnceWhenNATSIsBack(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "back")
	cfg.Retry.BaseDelay, cfg.Retry.MaxDelay = 2*time.Minute, 2*time.Minute
	startBridge(t, cfg)
	nc := natsConn(t)
	createStudents(t, ns, "before-%d", 1)
	waitStream(t, nc, cfg.NATS.Stream.Name, 1)

	st.NATS.Shutdown()
	restarted := false
	defer func() {
		if !restarted {
			_ = st.NATS.Restart()
		}
	}()
	createStudents(t, ns, "during-%d", 5)
	stacktest.WaitFor(t, "every publish during the outage failed", func() error {
		for i := range 5 {
			if c := publishedCondition(getStudent(t, ns, fmt.Sprintf("during-%d", i))); c == nil || c.Status != metav1.ConditionFalse {
				return fmt.Errorf("during-%d: %+v", i, c)
			}
		}
		return nil
	})
	if err := st.NATS.Restart(); err != nil {
		t.Fatal(err)
	}
	restarted = true

	// A change made after NATS is back: each edit is tried at once (an
	// edit is queued ahead of a backoff), until one is published.
	createStudents(t, ns, "after-%d", 1)
	waiting := map[string]bool{}
	err := stacktest.Eventually(time.Minute, func() error {
		patch(t, getStudent(t, ns, "after-0"), func(s *studentv1.Student) { s.Spec.School = time.Now().String() })
		got, err := stacktest.StreamEvents(ctx, nc, cfg.NATS.Stream.Name)
		if err != nil {
			return err
		}
		clear(waiting)
		for i := range 5 {
			waiting[fmt.Sprintf("during-%d", i)] = true
		}
		after := false
		for _, r := range got {
			delete(waiting, r.Data.Metadata.Name)
			after = after || r.Data.Metadata.Name == "after-0"
		}
		switch {
		case !after:
			return fmt.Errorf("nothing published since NATS is back")
		case len(waiting) > 0:
			return fmt.Errorf("the change after NATS is back is published; %d Students changed during the outage are not: %v", len(waiting), waiting)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestNATSDown: Students change while NATS is down. Status and Warning Events
// show the failure, deletes wait on the finalizer, and after NATS is back the
// stream holds every final state and every delete.
func TestNATSDown(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "outage")
	startBridge(t, cfg)
	nc := natsConn(t)

	for _, name := range []string{"keep", "edit", "gone"} {
		if err := st.Client.Create(ctx, newStudent(ns, name, name, "before")); err != nil {
			t.Fatal(err)
		}
	}
	waitStream(t, nc, cfg.NATS.Stream.Name, 3)

	st.NATS.Shutdown()
	restarted := false
	defer func() {
		if !restarted {
			_ = st.NATS.Restart()
		}
	}()

	patch(t, getStudent(t, ns, "edit"), func(s *studentv1.Student) { s.Spec.School = "during" })
	if err := st.Client.Create(ctx, newStudent(ns, "new", "new", "during")); err != nil {
		t.Fatal(err)
	}
	if err := st.Client.Delete(ctx, getStudent(t, ns, "gone")); err != nil {
		t.Fatal(err)
	}

	stacktest.WaitFor(t, "Published=False on the edited Student", func() error {
		c := publishedCondition(getStudent(t, ns, "edit"))
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != studentv1.ReasonPublishFailed {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})
	stacktest.WaitFor(t, "a Warning event on the new Student", func() error {
		for _, e := range kubeEvents(t, ns, "new") {
			if e.Type == corev1.EventTypeWarning && e.Reason == studentv1.ReasonPublishFailed {
				return nil
			}
		}
		return errors.New("none")
	})
	// The delete waits for NATS: the finalizer holds the object.
	if s := getStudent(t, ns, "gone"); s.DeletionTimestamp.IsZero() || !containsString(s.Finalizers, studentv1.Finalizer) {
		t.Fatalf("deleted Student not held by the finalizer: %+v", s.ObjectMeta)
	}

	if err := st.NATS.Restart(); err != nil {
		t.Fatal(err)
	}
	restarted = true

	got := waitStream(t, nc, cfg.NATS.Stream.Name, 6)
	final := map[string]string{}
	for _, r := range got {
		final[r.Data.Metadata.Name] = r.Event.Type() + " " + r.Data.Spec.School
	}
	want := map[string]string{
		"keep": studentv1.EventTypeCreated + " before",
		"edit": studentv1.EventTypeUpdated + " during",
		"new":  studentv1.EventTypeCreated + " during",
		"gone": studentv1.EventTypeDeleted + " before",
	}
	for name, w := range want {
		if final[name] != w {
			t.Errorf("last event of %s: %q, want %q (all: %v)", name, final[name], w, types(got))
		}
	}
	stacktest.WaitFor(t, "the deleted Student is gone after recovery", func() error {
		err := st.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "gone"}, &studentv1.Student{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (err %v)", err)
	})
	stacktest.WaitFor(t, "Published=True again", func() error {
		for _, name := range []string{"edit", "new"} {
			if c := publishedCondition(getStudent(t, ns, name)); c == nil || c.Status != metav1.ConditionTrue {
				return fmt.Errorf("%s: %+v", name, c)
			}
		}
		return nil
	})
}

// TestBinaryMode: with nats.encoding=binary the attributes travel as ce-*
// headers and the body is the data; sdk-go decodes it to the same event.
func TestBinaryMode(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "binary")
	cfg.NATS.Encoding = "binary"
	startBridge(t, cfg)
	nc := natsConn(t)

	if err := st.Client.Create(ctx, newStudent(ns, "object-name", "wang", "china")); err != nil {
		t.Fatal(err)
	}
	r := waitStream(t, nc, cfg.NATS.Stream.Name, 1)[0]
	for h, want := range map[string]string{
		"ce-specversion":     "1.0",
		"ce-type":            studentv1.EventTypeCreated,
		"ce-source":          "/clusters/test/apis/example.k8s.io/v1/students",
		"ce-subject":         ns + "/object-name",
		"ce-id":              r.Header.Get("Nats-Msg-Id"),
		"ce-datacontenttype": "application/json",
	} {
		if got := r.Header.Get(h); got != want || got == "" {
			t.Errorf("header %s = %q, want %q", h, got, want)
		}
	}
	if r.Header.Get("ce-time") == "" {
		t.Error("no ce-time header")
	}
	checkAttrs(t, r.Event, studentv1.EventTypeCreated, ns+"/object-name")
	if r.Data.Spec.Name != "wang" || r.Data.Metadata.Name != "object-name" {
		t.Errorf("data %+v", r.Data)
	}
}
