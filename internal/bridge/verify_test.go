package bridge_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/bridgetest"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/internal/verify"
)

// verifySource is what `student-bridge verify` reads for cfg.
func verifySource(cfg *config.Config, nc *nats.Conn) verify.Source {
	return verify.Source{NATS: nc, Stream: cfg.NATS.Stream.Name, Bucket: cfg.Records.Bucket, Kube: st.Client, Namespaces: cfg.Namespaces, Cluster: cfg.Cluster}
}

// TestVerifyFindsEachKindOfDrift: verify finds nothing in what a bridge
// published, and then each kind of drift made to happen for real: events
// deleted from the stream (a Student's last, and one in the middle of
// another's), a delete no bridge saw (finalizer removed, record removed),
// an event with a stale spec published under the bridge's subject by
// another writer, a message in the shape of an event without its content
// type, and an event published again after the stream's duplicate window.
func TestVerifyFindsEachKindOfDrift(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "verify")
	cfg.NATS.Stream.Duplicates = time.Second
	stop := startBridge(t, cfg)
	nc := natsConn(t)
	// a's created first: it stays the stream's first event, so deleting
	// others' events leaves no aged-out start.
	for i, n := range []string{"a", "b", "d", "e", "f"} {
		if err := st.Client.Create(ctx, newStudent(ns, n, n, "china")); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			waitStream(t, nc, cfg.NATS.Stream.Name, 1)
		}
	}
	waitStream(t, nc, cfg.NATS.Stream.Name, 5)
	for i, n := range []string{"b", "d", "d"} {
		bridgetest.Patch(t, st.Client, getStudent(t, ns, n), func(s *studentv1.Student) { s.Spec.School = fmt.Sprint("school-", i) })
		waitStream(t, nc, cfg.NATS.Stream.Name, 6+i)
	}
	stacktest.WaitFor(t, "verify to find nothing in what the bridge published", func() error {
		r, err := verify.Verify(ctx, verifySource(cfg, nc), verify.Options{})
		if err == nil && r.Events != 8 {
			err = fmt.Errorf("read %d events, want 8", r.Events)
		}
		if err == nil {
			err = r.Err()
		}
		return err
	})
	stop()

	js, stream := openStream(t, nc, cfg.NATS.Stream.Name)
	events, err := stacktest.StreamEvents(ctx, nc, cfg.NATS.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	of := func(name string) []stacktest.Received {
		var out []stacktest.Received
		for _, e := range events {
			if e.Data.Metadata.Name == name {
				out = append(out, e)
			}
		}
		return out
	}
	// b: both its events leave the stream; d: the first of its updates.
	for _, e := range append(of("b"), of("d")[1]) {
		if err := stream.DeleteMsg(ctx, e.Sequence); err != nil {
			t.Fatal(err)
		}
	}
	// a: deleted while no bridge runs, its finalizer and its record gone.
	a := getStudent(t, ns, "a")
	bridgetest.Patch(t, st.Client, a, func(s *studentv1.Student) { s.Finalizers = nil })
	if err := st.Client.Delete(ctx, a); err != nil {
		t.Fatal(err)
	}
	records, err := js.KeyValue(ctx, cfg.Records.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := records.Delete(ctx, string(a.UID)); err != nil {
		t.Fatal(err)
	}
	// e: an event with its old spec, as if published by a stray writer.
	e := getStudent(t, ns, "e")
	stale := e.DeepCopy()
	stale.Spec.School = "nowhere"
	created := of("e")[0]
	ev, err := contract.NewEvent(cfg.Cluster, studentv1.EventTypeUpdated, "stale-"+created.Event.ID(), stale, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	contract.Chain(&ev, 2, created.Event.ID())
	publish := func(msg *nats.Msg) {
		t.Helper()
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	msg, err := natssink.EncodeMsg(ctx, ev, cfg.NATS.SubjectPrefix+"."+studentv1.OperationUpdated, natssink.Encoding(cfg.NATS.Encoding))
	if err != nil {
		t.Fatal(err)
	}
	publish(msg)
	// A message on the bridge's subject in the shape of its events, as the
	// nats CLI sends it (no Content-Type): not a Student CloudEvent the
	// bridge published, whatever a consumer makes of it.
	publish(&nats.Msg{Subject: cfg.NATS.SubjectPrefix + "." + studentv1.OperationUpdated,
		Data: fmt.Appendf(nil, `{"specversion":"1.0","id":"x1","type":%q,"source":%q,"data":{"metadata":{"namespace":%q,"name":"e","uid":%q}}}`,
			studentv1.EventTypeUpdated, contract.Source(cfg.Cluster), ns, e.UID)})
	// f: its created event again, once the duplicate window has passed:
	// until then the stream acks the copy as a duplicate and drops it.
	f := of("f")[0]
	raw := mustRaw(t, stream, f.Sequence)
	if err := stacktest.Eventually(30*time.Second, func() error {
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: f.Subject, Header: f.Header, Data: raw})
		if err == nil && ack.Duplicate {
			err = fmt.Errorf("the copy of f's created event is within the duplicate window")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}

	r, err := verify.Verify(ctx, verifySource(cfg, nc), verify.Options{Settle: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range r.Findings {
		got = append(got, string(f.Kind)+" "+f.Name)
	}
	want := []string{"lost delete a", "missing b", "stale record b", "gap d", "foreign e", "foreign ", "duplicate f"}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("findings %q, want %q; report:\n%+v", got, want, r.Findings)
	}
	if r.Err() == nil {
		t.Error("a report with drift has no error")
	}
	// A label selector no Student matches: verify lists none of them, so
	// every Student with events and no deleted event is a lost delete
	// (for a bridge with that selector, they left its scope unannounced).
	scoped := verifySource(cfg, nc)
	scoped.Selector = labels.SelectorFromSet(labels.Set{"grade": "none"})
	sr, err := verify.Verify(ctx, scoped, verify.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if sr.Students != 0 || sr.Count(verify.LostDelete) != 4 {
		t.Errorf("with a selector matching nothing: %d Students, %d lost deletes (want 0 and 4: a, d, e, f)", sr.Students, sr.Count(verify.LostDelete))
	}
	var out bytes.Buffer
	if err := verify.Print(&out, r); err != nil {
		t.Fatal(err)
	}
	t.Logf("verify's report:\n%s", out.String())
}

// mustRaw returns the stored body of the message at seq.
func mustRaw(t *testing.T, stream jetstream.Stream, seq uint64) []byte {
	t.Helper()
	raw, err := stream.GetMsg(context.Background(), seq)
	if err != nil {
		t.Fatal(err)
	}
	return raw.Data
}

// settleHook starts work (a bridge) the first time verify says it checks
// again, and returns once that work is done: what the first reading found
// is published before the second reading.
type settleHook struct {
	work func()
	done bool
}

func (h *settleHook) Write(b []byte) (int, error) {
	if !h.done && bytes.Contains(b, []byte("checking again")) {
		h.done = true
		h.work()
	}
	return len(b), nil
}

// TestVerifySettleReadsAgain: a change the first reading finds unpublished
// (the bridge was stopped) and that is published during --settle is not
// reported: the sources are read again after the wait.
func TestVerifySettleReadsAgain(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "settle")
	stop := startBridge(t, cfg)
	nc := natsConn(t)
	if err := st.Client.Create(ctx, newStudent(ns, "a", "a", "china")); err != nil {
		t.Fatal(err)
	}
	waitStream(t, nc, cfg.NATS.Stream.Name, 1)
	stop()
	bridgetest.Patch(t, st.Client, getStudent(t, ns, "a"), func(s *studentv1.Student) { s.Spec.School = "tsinghua" })

	src := verifySource(cfg, nc)
	first, err := verify.Verify(ctx, src, verify.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if first.Count(verify.Missing) != 1 {
		t.Fatalf("with the bridge stopped, findings %+v, want a missing update", first.Findings)
	}
	hook := &settleHook{work: func() {
		startBridge(t, cfg)
		waitStream(t, nc, cfg.NATS.Stream.Name, 2)
	}}
	src.Progress = hook
	r, err := verify.Verify(ctx, src, verify.Options{Settle: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !hook.done {
		t.Fatal("verify did not check again")
	}
	if err := r.Err(); err != nil || r.Events != 2 {
		t.Errorf("verify --settle reported a change published during the wait (%d events read): %v", r.Events, err)
	}
}
