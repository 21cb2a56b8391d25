package bridge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-bridge/student-bridge/api/contract"
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
	bucketStream := "KV_" + cfg.State.Bucket
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
	kv, err := js.KeyValue(ctx, cfg.State.Bucket)
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

// TestUpgradeFromStatusRecords: Students published by a version of the
// bridge that kept its record in status.lastPublished, and an empty bucket:
// the bridge seeds the bucket from the status and publishes nothing; the
// next change chains to the id in the status.
func TestUpgradeFromStatusRecords(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "upgrade")
	nc := natsConn(t)
	var ids []string
	for i := range 2 {
		stu := newStudent(ns, fmt.Sprintf("old-%d", i), "wang", "china")
		stu.Finalizers = []string{studentv1.Finalizer}
		if err := st.Client.Create(ctx, stu); err != nil {
			t.Fatal(err)
		}
		id := contract.EventID(studentv1.EventTypeCreated, stu, "")
		ids = append(ids, id)
		stu.Status.LastPublished = &studentv1.PublishedEvent{
			Type: studentv1.EventTypeCreated, ID: id, Time: metav1.NewTime(time.Now().Truncate(time.Second)),
			Generation: stu.Generation, Sequence: int64(i + 1), Spec: stu.Spec,
		}
		if err := st.Client.Status().Update(ctx, stu); err != nil {
			t.Fatal(err)
		}
	}
	// The stream holds what that version published.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.NATS.Stream.Name, Subjects: []string{cfg.NATS.SubjectPrefix + ".>"}}); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		ev, err := contract.NewEvent(cfg.Cluster, studentv1.EventTypeCreated, id, getStudent(t, ns, fmt.Sprintf("old-%d", i)), nil, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		body, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		msg := nats.NewMsg(cfg.NATS.SubjectPrefix + ".created")
		msg.Header.Set("Content-Type", "application/cloudevents+json")
		msg.Data = body
		if _, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(id)); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := stacktest.Subscribe(nc, "upgrade.>")
	if err != nil {
		t.Fatal(err)
	}
	startBridge(t, cfg)
	stacktest.WaitFor(t, "the bucket seeded from status", func() error {
		kv, err := js.KeyValue(ctx, cfg.State.Bucket)
		if err != nil {
			return err
		}
		st, err := kv.Status(ctx)
		if err != nil {
			return err
		}
		if st.Values() != 3 { // two records and the shard count
			return fmt.Errorf("bucket holds %d values", st.Values())
		}
		return nil
	})
	patch(t, getStudent(t, ns, "old-0"), func(s *studentv1.Student) { s.Spec.School = "beijing" })
	got := waitStream(t, nc, cfg.NATS.Stream.Name, 3)[2]
	old0 := getStudent(t, ns, "old-0")
	if want := contract.EventID(studentv1.EventTypeUpdated, old0, ids[0]); got.Event.ID() != want || got.Data.PreviousSpec == nil || got.Data.PreviousSpec.School != "china" {
		t.Errorf("first event after the upgrade: %s id %s previous %+v, want updated id %s chained to the status", got.Event.Type(), got.Event.ID(), got.Data.PreviousSpec, want)
	}
	seen, err := sub.Events()
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 {
		t.Errorf("a core subscriber saw %v, want only the update", types(seen))
	}
}

// TestSeedIgnoresAnotherStreamsStatus: Students whose status another
// bridge wrote, publishing to another stream (here: its sequence 7 where
// this stream holds nothing), are not taken as published to this one:
// the bridge publishes them.
func TestSeedIgnoresAnotherStreamsStatus(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "elsewhere")
	stu := newStudent(ns, "seen-elsewhere", "wang", "china")
	if err := st.Client.Create(ctx, stu); err != nil {
		t.Fatal(err)
	}
	stu.Status.LastPublished = &studentv1.PublishedEvent{
		Type: studentv1.EventTypeCreated, ID: contract.EventID(studentv1.EventTypeCreated, stu, ""), Time: metav1.NewTime(time.Now().Truncate(time.Second)),
		Generation: stu.Generation, Sequence: 7, Spec: stu.Spec,
	}
	if err := st.Client.Status().Update(ctx, stu); err != nil {
		t.Fatal(err)
	}
	startBridge(t, cfg)
	got := waitStream(t, natsConn(t), cfg.NATS.Stream.Name, 1)
	if got[0].Event.Type() != studentv1.EventTypeCreated || got[0].Data.Metadata.Name != "seen-elsewhere" {
		t.Errorf("published %s of %s, want created of seen-elsewhere", got[0].Event.Type(), got[0].Data.Metadata.Name)
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
