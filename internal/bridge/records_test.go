package bridge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// TestRecordStoreUnavailable: while the bucket refuses writes, an update
// that went out is not published again and nothing new is published (fail
// closed, shown as a Warning Event); once the bucket takes writes again the
// record is written and the waiting Student published, each exactly once.
func TestRecordStoreUnavailable(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "closed")
	startBridge(t, cfg)
	nc := natsConn(t)
	sub, err := stacktest.Subscribe(nc, "closed.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Client.Create(ctx, newStudent(ns, "a", "wang", "china")); err != nil {
		t.Fatal(err)
	}
	waitStream(t, nc, cfg.NATS.Stream.Name, 1)

	// The bucket is full and refuses every further write.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	bucketStream := "KV_" + cfg.Records.Bucket
	limit := func(maxMsgs int64) {
		t.Helper()
		s, err := js.Stream(ctx, bucketStream)
		if err != nil {
			t.Fatal(err)
		}
		sc := s.CachedInfo().Config
		sc.MaxMsgs = maxMsgs
		if _, err := js.UpdateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	limit(1)
	patch(t, getStudent(t, ns, "a"), func(s *studentv1.Student) { s.Spec.School = "beijing" })
	waitStream(t, nc, cfg.NATS.Stream.Name, 2)
	if err := st.Client.Create(ctx, newStudent(ns, "b", "li", "shanghai")); err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, "a Warning Event on b while the record store refuses writes", func() error {
		for _, e := range kubeEvents(t, ns, "b") {
			if e.Type == corev1.EventTypeWarning && e.Reason == studentv1.ReasonPublishFailed {
				return nil
			}
		}
		return fmt.Errorf("none")
	})
	if got := waitStream(t, nc, cfg.NATS.Stream.Name, 2); got[1].Data.Metadata.Name != "a" {
		t.Fatalf("second event is %v, want a's update", types(got))
	}

	limit(-1)
	got := waitStream(t, nc, cfg.NATS.Stream.Name, 3)
	if got[2].Data.Metadata.Name != "b" || got[2].Event.Type() != studentv1.EventTypeCreated {
		t.Errorf("after the bucket is back: %v, want b created", types(got))
	}
	a := getStudent(t, ns, "a")
	kv, err := js.KeyValue(ctx, cfg.Records.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, "a's update recorded", func() error {
		e, err := kv.Get(ctx, string(a.UID))
		if err != nil {
			return err
		}
		var rec studentv1.StudentRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return err
		}
		if rec.Published.ID != got[1].Event.ID() {
			return fmt.Errorf("record holds %s %s, want the update %s", rec.Published.Type, rec.Published.ID, got[1].Event.ID())
		}
		return nil
	})
	seen, err := sub.Events()
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 3 {
		t.Errorf("a core subscriber saw %v, want each event once", types(seen))
	}
}

// TestScopeExit: a Student that stops matching the label selector left the
// set the bridge publishes: consumers get a deleted event with its current
// state, and its finalizer is removed so it can be deleted without the
// bridge. Coming back, it is created again with a new id.
func TestScopeExit(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "scope")
	cfg.LabelSelector = "team=a"
	startBridge(t, cfg)
	nc := natsConn(t)
	stu := newStudent(ns, "mover", "wang", "china")
	stu.Labels = map[string]string{"team": "a"}
	if err := st.Client.Create(ctx, stu); err != nil {
		t.Fatal(err)
	}
	first := waitStream(t, nc, cfg.NATS.Stream.Name, 1)[0]

	patch(t, getStudent(t, ns, "mover"), func(s *studentv1.Student) { s.Labels["team"] = "b" })
	got := waitStream(t, nc, cfg.NATS.Stream.Name, 2)
	if got[1].Event.Type() != studentv1.EventTypeDeleted || got[1].Data.Metadata.Labels["team"] != "b" {
		t.Errorf("leaving the scope published %s with labels %v, want deleted with team=b", got[1].Event.Type(), got[1].Data.Metadata.Labels)
	}
	stacktest.WaitFor(t, "the finalizer removed", func() error {
		if fs := getStudent(t, ns, "mover").Finalizers; len(fs) != 0 {
			return fmt.Errorf("finalizers %v", fs)
		}
		return nil
	})

	patch(t, getStudent(t, ns, "mover"), func(s *studentv1.Student) { s.Labels["team"] = "a" })
	got = waitStream(t, nc, cfg.NATS.Stream.Name, 3)
	if got[2].Event.Type() != studentv1.EventTypeCreated || got[2].Event.ID() == first.Event.ID() {
		t.Errorf("coming back published %s id %s, want created with a new id (first was %s)", got[2].Event.Type(), got[2].Event.ID(), first.Event.ID())
	}
	// Its count goes on: no number is used twice, and each event names the
	// one before it.
	for i, e := range got {
		seq := e.Event.Extensions()[studentv1.ExtensionSequence]
		if n, ok := studentv1.ParseSequence(seq); !ok || n != int64(i+1) {
			t.Errorf("event %d (%s) carries sequence %v, want %d", i+1, e.Event.Type(), seq, i+1)
		}
		prev, _ := e.Event.Extensions()[studentv1.ExtensionPreviousID].(string)
		if i > 0 && prev != got[i-1].Event.ID() {
			t.Errorf("event %d (%s) names %q as the one before it, want %s", i+1, e.Event.Type(), prev, got[i-1].Event.ID())
		}
	}
}
