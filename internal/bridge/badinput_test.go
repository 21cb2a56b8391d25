package bridge_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// TestOversizedEvent: a Student whose event exceeds the server's maximum
// payload (here through many labels, which the schema cannot bound) gets a
// Warning Event and Published=False/InvalidEvent, is not retried in a loop,
// and does not hold back other Students. Once it shrinks, it is published.
func TestOversizedEvent(t *testing.T) {
	ctx := context.Background()
	small, err := stack.StartNATS(stack.NATSOptions{Configure: func(o *natsserver.Options) { o.MaxPayload = 2048 }})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Stop()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "big")
	cfg.NATS.URLs = small.URL()
	startBridge(t, cfg)
	nc, err := nats.Connect(small.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	attempts := func() float64 {
		return counter(t, "student_bridge_events_published_total", map[string]string{"result": "error"}) +
			counter(t, "student_bridge_record_store_operations_total", map[string]string{"op": "put", "result": "error"})
	}
	terminal := func() float64 {
		return counter(t, "controller_runtime_terminal_reconcile_errors_total", map[string]string{"controller": "student-bridge"})
	}
	before, terminalBefore := attempts(), terminal()
	huge := newStudent(ns, "huge", "wang", "china")
	huge.Labels = map[string]string{}
	for i := range 40 {
		huge.Labels[fmt.Sprintf("label-%02d", i)] = strings.Repeat("v", 60)
	}
	if err := st.Client.Create(ctx, huge); err != nil {
		t.Fatal(err)
	}
	if err := st.Client.Create(ctx, newStudent(ns, "normal", "li", "peking")); err != nil {
		t.Fatal(err)
	}
	got := waitStream(t, nc, cfg.NATS.Stream.Name, 1)
	if got[0].Data.Metadata.Name != "normal" {
		t.Errorf("published %s, want the normal Student", got[0].Data.Metadata.Name)
	}
	stacktest.WaitFor(t, "InvalidEvent on the oversized Student", func() error {
		c := publishedCondition(getStudent(t, ns, "huge"))
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != studentv1.ReasonInvalid || !strings.Contains(c.Message, "too large") {
			return fmt.Errorf("condition %+v", c)
		}
		for _, e := range kubeEvents(t, ns, "huge") {
			if e.Type == corev1.EventTypeWarning && e.Reason == studentv1.ReasonInvalid {
				return nil
			}
		}
		return errors.New("no Warning event")
	})
	// Not retried: its reconcile ended in a terminal error, which the
	// controller never queues again, and while five more Students are
	// published no further attempt is made.
	stacktest.WaitFor(t, "the oversized Student's reconcile to end in a terminal error", func() error {
		if n := terminal() - terminalBefore; n != 1 {
			return fmt.Errorf("%v terminal errors, want 1", n)
		}
		return nil
	})
	for i := range 5 {
		if err := st.Client.Create(ctx, newStudent(ns, fmt.Sprintf("more-%d", i), "li", "peking")); err != nil {
			t.Fatal(err)
		}
	}
	waitStream(t, nc, cfg.NATS.Stream.Name, 6)
	if n := attempts() - before; n != 1 {
		t.Errorf("%v failed attempts for the oversized Student, want 1: it is being retried", n)
	}
	warnings := 0
	for _, e := range kubeEvents(t, ns, "huge") {
		if e.Type == corev1.EventTypeWarning {
			warnings++
		}
	}
	if warnings != 1 {
		t.Errorf("%d Warning events, want 1", warnings)
	}

	patch(t, getStudent(t, ns, "huge"), func(s *studentv1.Student) { s.Labels = map[string]string{"fits": "now"} })
	got = waitStream(t, nc, cfg.NATS.Stream.Name, 7)
	if got[6].Data.Metadata.Name != "huge" || got[6].Event.Type() != studentv1.EventTypeCreated {
		t.Errorf("after shrinking: %s %s", got[6].Event.Type(), got[6].Data.Metadata.Name)
	}
}
