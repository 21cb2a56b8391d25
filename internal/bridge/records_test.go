package bridge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/internal/verify"
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

// TestDeletionSeenIsNotReadAgain: without a finalizer or a label
// selector, a deletion the watch showed is published from the state the
// watch carried, without reading the Student from the API server (a read
// per delete). With a label selector it is read (TestScopeExit).
func TestDeletionSeenIsNotReadAgain(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "seen")
	cfg.Deletes.HoldWithFinalizer = false
	startBridge(t, cfg)
	nc := natsConn(t)
	const n = 5
	createStudents(t, ns, "s%d", n)
	waitStream(t, nc, cfg.NATS.Stream.Name, n)

	reads := func() float64 {
		t.Helper()
		v, err := stacktest.CounterOf("student_bridge_api_requests_total", map[string]string{"verb": "get", "resource": "students"})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := reads()
	for i := range n {
		if err := st.Client.Delete(ctx, getStudent(t, ns, fmt.Sprintf("s%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	got := waitStream(t, nc, cfg.NATS.Stream.Name, 2*n)
	for _, r := range got[n:] {
		if r.Event.Type() != studentv1.EventTypeDeleted {
			t.Errorf("%s: %s, want deleted", r.Data.Metadata.Name, r.Event.Type())
		}
	}
	if d := reads() - before; d != 0 {
		t.Errorf("publishing %d deletions the watch showed read Students %v times from the API server, want 0", n, d)
	}
}

// frozenStore makes a record bucket's stream stop answering writes, as a
// stream leader that froze does, and then answer them late, as one that
// thawed does: its subjects move aside, and a subscriber holds every write
// meanwhile; thaw moves them back and hands each held write to the stream,
// its answer to the writer that waits for it. Reads of the stream (by
// sequence or last message) are answered all along.
type frozenStore struct {
	t      *testing.T
	nc     *nats.Conn
	js     jetstream.JetStream
	stream string
	config jetstream.StreamConfig // the stream's, before it froze
	sub    *nats.Subscription
	held   chan *nats.Msg
}

func freezeBucket(t *testing.T, nc *nats.Conn, js jetstream.JetStream, bucket string) *frozenStore {
	t.Helper()
	ctx := context.Background()
	f := &frozenStore{t: t, nc: nc, js: js, stream: "KV_" + bucket, held: make(chan *nats.Msg, 100)}
	s, err := js.Stream(ctx, f.stream)
	if err != nil {
		t.Fatal(err)
	}
	f.config = s.CachedInfo().Config
	// The subjects move first, then the writes are held: a write between
	// the two has no responder and fails at once, and every write held was
	// answered by nobody.
	moved := f.config
	moved.Subjects = []string{"$KV." + bucket + "-frozen.>"}
	moved.MaxMsgs = -1
	if _, err := js.UpdateStream(ctx, moved); err != nil {
		t.Fatal(err)
	}
	if f.sub, err = nc.Subscribe("$KV."+bucket+".>", func(m *nats.Msg) { f.held <- m }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return f
}

// next waits for the next write the frozen stream holds.
func (f *frozenStore) next() *nats.Msg {
	f.t.Helper()
	select {
	case m := <-f.held:
		return m
	case <-time.After(time.Minute):
		f.t.Fatal("no write reached the frozen record store")
		return nil
	}
}

// thaw gives the stream its subjects back and answers held, and every write
// held since, with the stream's own answer.
func (f *frozenStore) thaw(held ...*nats.Msg) {
	f.t.Helper()
	restored := f.config
	restored.MaxMsgs = -1
	if _, err := f.js.UpdateStream(context.Background(), restored); err != nil {
		f.t.Fatal(err)
	}
	if err := f.sub.Unsubscribe(); err != nil {
		f.t.Fatal(err)
	}
	for {
		select {
		case m := <-f.held:
			held = append(held, m)
			continue
		default:
		}
		break
	}
	for _, m := range held {
		answer, err := f.nc.RequestMsg(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data}, 10*time.Second)
		if err != nil {
			f.t.Fatal(err)
		}
		if err := m.RespondMsg(&nats.Msg{Header: answer.Header, Data: answer.Data}); err != nil {
			f.t.Fatal(err)
		}
	}
}

// TestStalledRecordStoreHoldsUpNoOtherStudent: while the record store
// does not answer (its stream frozen) the write of records held back by an
// earlier failure, the bridge keeps up with every other Student: the
// cache takes a new one in (its status view is written), and a reconcile
// of it finishes (with a Warning Event: nothing is published while
// records wait). Once the store answers, every record is written and each
// event is in the stream once.
func TestStalledRecordStoreHoldsUpNoOtherStudent(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "stall")
	// A write the store does not answer waits this long: longer than the
	// test waits for the other Student.
	cfg.NATS.AckTimeout = 2 * time.Minute
	startBridge(t, cfg)
	nc := natsConn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Client.Create(ctx, newStudent(ns, "a", "wang", "china")); err != nil {
		t.Fatal(err)
	}
	waitStream(t, nc, cfg.NATS.Stream.Name, 1)

	// The bucket refuses a record of a new key at once: c's reservation
	// is held back, unsaved.
	bucket := "KV_" + cfg.Records.Bucket
	s, err := js.Stream(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	full := s.CachedInfo().Config
	full.MaxMsgs = 1
	if _, err := js.UpdateStream(ctx, full); err != nil {
		t.Fatal(err)
	}
	if err := st.Client.Create(ctx, newStudent(ns, "c", "zhao", "china")); err != nil {
		t.Fatal(err)
	}
	warned := func(name string) func() error {
		return func() error {
			for _, e := range kubeEvents(t, ns, name) {
				if e.Type == corev1.EventTypeWarning && e.Reason == studentv1.ReasonPublishFailed {
					return nil
				}
			}
			return fmt.Errorf("no %s Warning Event on %s", studentv1.ReasonPublishFailed, name)
		}
	}
	stacktest.WaitFor(t, "c's record refused", warned("c"))

	// Now the store stops answering: c's retry writes the held-back
	// record, and waits, holding the one flush; a reconcile of another
	// Student finds it under way and does not wait for it.
	frozen := freezeBucket(t, nc, js, cfg.Records.Bucket)
	flush := frozen.next()
	if err := st.Client.Create(ctx, newStudent(ns, "b", "li", "shanghai")); err != nil {
		t.Fatal(err)
	}
	// A bound that only a lock held across the stalled write reaches: the
	// write waits for two minutes.
	seen := func() error {
		if c := publishedCondition(getStudent(t, ns, "b")); c == nil || c.Status != metav1.ConditionFalse {
			return fmt.Errorf("b's Published condition is %+v: the cache has not shown b to the status writer", c)
		}
		return warned("b")()
	}
	if err := stacktest.Eventually(20*time.Second, seen); err != nil {
		t.Logf("Kubernetes Events on b: %d; the bridge's goroutines in the records and the reconciler:\n%s", len(kubeEvents(t, ns, "b")), bridgeStacks())
		t.Fatalf("while a write of the record store hung, a new Student was not taken in: %v", err)
	}

	frozen.thaw(flush)
	got := waitStream(t, nc, cfg.NATS.Stream.Name, 3)
	stacktest.WaitFor(t, "verify to find every record written and each event once", func() error {
		r, err := verify.Verify(ctx, verifySource(cfg, nc), verify.Options{})
		if err == nil && r.Events != 3 {
			err = fmt.Errorf("read %d events, want 3", r.Events)
		}
		if err == nil {
			err = r.Err()
		}
		return err
	})
	if names := []string{got[1].Data.Metadata.Name, got[2].Data.Metadata.Name}; !slices.Contains(names, "b") || !slices.Contains(names, "c") {
		t.Errorf("after the store answered: %v of %v, want b and c created", types(got), names)
	}
}

// bridgeStacks are the stacks of the goroutines in the records or the
// reconciler: where the bridge waits, when it waits too long.
func bridgeStacks() string {
	buf := make([]byte, 1<<24)
	var out []string
	for g := range strings.SplitSeq(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "internal/records.") || strings.Contains(g, "student-bridge/reconciler.") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// TestDeleteMarkersPurgedWhileRunning: the delete markers removed records
// and receipts leave are purged once older than records.deleteMarkerAge
// while the bridge runs, not only at its next start.
func TestDeleteMarkersPurgedWhileRunning(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "markers")
	cfg.Records.DeleteMarkerAge = 3 * time.Second
	startBridge(t, cfg)
	nc := natsConn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var records, receipts jetstream.KeyValue
	stacktest.WaitFor(t, "both buckets", func() (err error) {
		if records, err = js.KeyValue(ctx, cfg.Records.Bucket); err != nil {
			return err
		}
		receipts, err = js.KeyValue(ctx, cfg.Receipts.Bucket)
		return err
	})
	createStudents(t, ns, "s%d", 5)
	events := waitStream(t, nc, cfg.NATS.Stream.Name, 5)
	applied := receiptCount(t, studentv1.ResultApplied)
	for _, e := range events {
		stu := getStudent(t, ns, e.Data.Metadata.Name)
		b, _ := json.Marshal(studentv1.Receipt{Service: "billing", UID: string(stu.UID), Namespace: ns, Name: stu.Name,
			EventID: e.Event.ID(), Generation: stu.Generation, Result: studentv1.ResultApplied, Time: metav1.Now()})
		if _, err := receipts.Put(ctx, studentv1.ReceiptKey("billing", string(stu.UID)), b); err != nil {
			t.Fatal(err)
		}
	}
	stacktest.WaitFor(t, "the receipts taken", func() error {
		if n := receiptCount(t, studentv1.ResultApplied); n < applied+5 {
			return fmt.Errorf("receipts counted applied %v, want %v", n, applied+5)
		}
		return nil
	})
	for i := range 5 {
		if err := st.Client.Delete(ctx, getStudent(t, ns, fmt.Sprintf("s%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	waitStream(t, nc, cfg.NATS.Stream.Name, 10)
	stacktest.WaitFor(t, "the markers purged", func() error {
		for name, kv := range map[string]jetstream.KeyValue{"records": records, "receipts": receipts} {
			if n, err := markers(kv); err != nil {
				return fmt.Errorf("the %s bucket: %w", name, err)
			} else if n != 0 {
				return fmt.Errorf("the %s bucket holds %d delete markers; they are older than %s", name, n, cfg.Records.DeleteMarkerAge)
			}
		}
		return nil
	})
}

// markers counts the delete markers in kv. A watch that the bridge's
// purge overtakes can wait forever for the entries it was told are there:
// it gives up after a few seconds, and the caller looks again.
func markers(kv jetstream.KeyValue) (n int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return 0, fmt.Errorf("its watch ended before its entries: %w", ctx.Err())
			}
			if e == nil {
				return n, nil // every entry read
			}
			if op := e.Operation(); op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge {
				n++
			}
		case <-ctx.Done():
			return 0, fmt.Errorf("reading its entries: %w", ctx.Err())
		}
	}
}
