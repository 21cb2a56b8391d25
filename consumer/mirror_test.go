//go:build !nostack

package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/consumer"
	"github.com/student-bridge/student-bridge/internal/services"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// mirror starts a Mirror of service with handler (and the tweaked
// options); stop cancels it and waits for Run to return.
func (w *world) mirror(t *testing.T, service string, handler consumer.Handler, tweaks ...func(*consumer.MirrorOptions)) (*consumer.Mirror, func()) {
	t.Helper()
	return w.mirrorOn(t, w.nc, service, handler, tweaks...)
}

// options are the Mirror options of service in w: its bridge's stream,
// subjects, receipts bucket and snapshot subject, short retries, no log.
func (w *world) options(service string, handler consumer.Handler, tweaks ...func(*consumer.MirrorOptions)) consumer.MirrorOptions {
	o := consumer.MirrorOptions{
		Service: service, Handler: handler, Stream: w.cfg.NATS.Stream.Name, Subjects: w.cfg.NATS.SubjectPrefix + ".>",
		ReceiptsBucket: w.cfg.Receipts.Bucket, SnapshotSubject: w.cfg.Snapshot.RequestSubject,
		RetryBaseDelay: 100 * time.Millisecond, RetryMaxDelay: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	for _, tweak := range tweaks {
		tweak(&o)
	}
	return o
}

// mirrorOn is mirror on the connection nc.
func (w *world) mirrorOn(t *testing.T, nc *nats.Conn, service string, handler consumer.Handler, tweaks ...func(*consumer.MirrorOptions)) (*consumer.Mirror, func()) {
	t.Helper()
	m, err := consumer.NewMirror(nc, w.options(service, handler, tweaks...))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("mirror %s: %v", service, err)
			}
		})
	}
	t.Cleanup(stop)
	return m, stop
}

// recorder is a handler that remembers every change it was given.
type recorder struct {
	mu      sync.Mutex
	changes []consumer.Change
	fail    func(consumer.Change) error
}

func (r *recorder) handle(_ context.Context, c consumer.Change) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes = append(r.changes, c)
	if r.fail != nil {
		return r.fail(c)
	}
	return nil
}

func (r *recorder) take() []consumer.Change {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.changes
	r.changes = nil
	return out
}

func mirrorState(m *consumer.Mirror) map[string]string {
	out := map[string]string{}
	for uid, d := range m.State() {
		out[uid] = d.Name + "=" + d.Spec.School
	}
	return out
}

// waitSame waits until the mirror holds exactly the world's Students.
func (w *world) waitSame(t *testing.T, m *consumer.Mirror) map[string]string {
	t.Helper()
	var want map[string]string
	if err := stacktest.Eventually(60*time.Second, func() error {
		want = w.state()
		if got := mirrorState(m); fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("mirror holds %d Students, the world %d; differ: %v", len(got), len(want), diff(got, want))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return want
}

func diff(got, want map[string]string) []string {
	var out []string
	for k, v := range want {
		if got[k] != v {
			out = append(out, fmt.Sprintf("%s: %q want %q", k, got[k], v))
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			out = append(out, fmt.Sprintf("%s: %q not in the world", k, v))
		}
	}
	sort.Strings(out)
	if len(out) > 5 {
		out = append(out[:5], "...")
	}
	return out
}

// waitPublished waits until the stream holds n events.
func (w *world) waitPublished(t *testing.T, n int) {
	t.Helper()
	if err := stacktest.Eventually(60*time.Second, func() error {
		evs, err := stacktest.StreamEvents(context.Background(), w.nc, w.cfg.NATS.Stream.Name)
		if err != nil {
			return err
		}
		if len(evs) != n {
			return fmt.Errorf("stream holds %d events, want %d", len(evs), n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// waitAcked waits until service's durable consumer acknowledged seq.
func (w *world) waitAcked(t *testing.T, service string, seq uint64) {
	t.Helper()
	js, err := jetstream.New(w.nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := stacktest.Eventually(30*time.Second, func() error {
		c, err := js.Consumer(context.Background(), w.cfg.NATS.Stream.Name, service)
		if err != nil {
			return err
		}
		info, err := c.Info(context.Background())
		if err != nil {
			return err
		}
		if info.AckFloor.Stream < seq {
			return fmt.Errorf("%s acknowledged up to %d, want %d", service, info.AckFloor.Stream, seq)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// waitSequences waits until the stream holds the events from first
// (0: whatever its first) to last: its limits may have dropped the first.
func (w *world) waitSequences(t *testing.T, first, last uint64) {
	t.Helper()
	js, err := jetstream.New(w.nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := stacktest.Eventually(60*time.Second, func() error {
		s, err := js.Stream(context.Background(), w.cfg.NATS.Stream.Name)
		if err != nil {
			return err
		}
		info, err := s.Info(context.Background())
		if err != nil {
			return err
		}
		if info.State.LastSeq != last || (first != 0 && info.State.FirstSeq != first) {
			return fmt.Errorf("stream at sequences %d-%d, want %d-%d", info.State.FirstSeq, info.State.LastSeq, first, last)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestMirrorRebuildsThenFollows: a mirror started after 100 Students were
// created and 20 deleted ends with exactly the API server's Students,
// handing each live Student over once and no deleted one; stopped and
// started again, it gets the changes of its downtime, once per Student, in
// stream order (one handler at a time), with the state it applied before as
// Old.
func TestMirrorRebuildsThenFollows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, "mirror")
	var all []*studentv1.Student
	for i := range 100 {
		all = append(all, w.create(t, fmt.Sprintf("s%03d", i), "china"))
	}
	// Published first: without the finalizer policy, a Student deleted
	// before the bridge held it with its finalizer gets no event at all
	// (docs/guarantees.md), which a busy machine makes likely.
	w.waitPublished(t, 100)
	for _, s := range all[:20] {
		w.remove(t, s)
	}
	w.waitPublished(t, 120)

	rec := &recorder{}
	m, stop := w.mirror(t, "roster", rec.handle)
	want := w.waitSame(t, m)
	changes := rec.take()
	if len(changes) != 80 {
		t.Errorf("the rebuild handed over %d changes, want one per live Student (80)", len(changes))
	}
	for _, c := range changes {
		if c.Old != nil || c.New == nil || want[c.UID] == "" {
			t.Errorf("rebuild change %s/%s: Old %v, New %v", c.Namespace, c.Name, c.Old, c.New)
		}
	}

	// The rebuild read through a consumer of the service's own name, and
	// left none behind: the stream's consumers are the durable one.
	js, err := jetstream.New(w.nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, w.cfg.NATS.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	lister := stream.ConsumerNames(ctx)
	var consumers []string
	for name := range lister.Name() {
		consumers = append(consumers, name)
	}
	if err := lister.Err(); err != nil || len(consumers) != 1 || consumers[0] != "roster" {
		t.Errorf("the stream's consumers after the rebuild: %v (%v), want only roster", consumers, err)
	}

	// Downtime: updates (one Student twice), deletes and creates.
	w.waitAcked(t, "roster", 120)
	stop()
	updated := all[20:25]
	for _, s := range updated {
		w.update(t, s, "tsinghua")
	}
	w.waitPublished(t, 125)
	w.update(t, updated[0], "peking")
	for _, s := range all[25:28] {
		w.remove(t, s)
	}
	w.create(t, "new-a", "fudan")
	w.create(t, "new-b", "fudan")
	w.waitPublished(t, 131)

	// One handler at a time: the changes start in stream order, and with
	// more than one handler, different Students' handlers overlap.
	m, stop = w.mirror(t, "roster", rec.handle, func(o *consumer.MirrorOptions) { o.Concurrency = 1 })
	w.waitSame(t, m)
	changes = rec.take()
	byName := map[string]consumer.Change{}
	for _, c := range changes {
		if _, dup := byName[c.Name]; dup {
			t.Errorf("%s handed over twice after the restart", c.Name)
		}
		byName[c.Name] = c
	}
	if len(changes) != 10 {
		t.Errorf("after the restart %d changes were handed over, want 10 (5 updated, 3 deleted, 2 created): %v", len(changes), names(changes))
	}
	if c := byName[updated[0].Name]; c.Old == nil || c.Old.Spec.School != "china" || c.New == nil || c.New.Spec.School != "peking" {
		t.Errorf("%s updated twice while down: Old %+v New %+v, want china -> peking", updated[0].Name, c.Old, c.New)
	}
	for _, s := range all[25:28] {
		if c := byName[s.Name]; c.New != nil || c.Old == nil || c.EventType != studentv1.EventTypeDeleted {
			t.Errorf("%s deleted while down: %+v", s.Name, c)
		}
	}
	if c := byName["new-a"]; c.Old != nil || c.New == nil || c.New.Spec.School != "fudan" {
		t.Errorf("new-a created while down: %+v", c)
	}
	// In stream order of the newest event of each Student.
	for i := 1; i < len(changes); i++ {
		if seq(changes[i-1]) > seq(changes[i]) && seq(changes[i]) != 0 {
			t.Errorf("changes out of stream order: %s (%d) before %s (%d)", changes[i-1].Name, seq(changes[i-1]), changes[i].Name, seq(changes[i]))
		}
	}

	// Its position lost (the durable consumer deleted): the receipts tell
	// what it applied, and nothing is handed over again.
	w.waitAcked(t, "roster", 131)
	stop()
	if err := js.DeleteConsumer(ctx, w.cfg.NATS.Stream.Name, "roster"); err != nil {
		t.Fatal(err)
	}
	m, _ = w.mirror(t, "roster", rec.handle)
	w.waitSame(t, m)
	if again := rec.take(); len(again) != 0 {
		t.Errorf("with its consumer deleted, %d changes were handed over again: %v", len(again), names(again))
	}
}

func seq(c consumer.Change) uint64 {
	if c.New != nil {
		return c.New.Sequence
	}
	return 0
}

func names(cs []consumer.Change) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

// TestMirrorRetriesAndReports: a change the handler fails three times is
// retried, reported failed (a receipt with the handler's error), then
// applied (a receipt of the event applied); other Students are not held
// back meanwhile. (How the bridge shows receipts on a Student's status is
// the bridge's to test.)
func TestMirrorRetriesAndReports(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, "retry")
	// stubborn fails at least three times, and until other was applied:
	// other must not wait for it.
	var failures int
	var otherApplied bool
	rec := &recorder{fail: func(c consumer.Change) error {
		if c.Name == "stubborn" && (failures < 3 || !otherApplied) {
			failures++
			return errors.New("library system offline")
		}
		if c.Name == "other" {
			otherApplied = true
		}
		return nil
	}}
	_, _ = w.mirror(t, "roster", rec.handle)

	stubborn := w.create(t, "stubborn", "china")
	w.waitReceipt(t, "roster", stubborn, func(r studentv1.Receipt) error {
		if r.Result != studentv1.ResultFailed || !strings.Contains(r.Message, "library system offline") {
			return fmt.Errorf("receipt %+v, want failed with the handler's error", r)
		}
		return nil
	})
	report := func() map[string]services.Row {
		rows, err := services.Report(ctx, w.nc, services.Options{Stream: w.cfg.NATS.Stream.Name, RecordsBucket: w.cfg.Records.Bucket,
			ReceiptsBucket: w.cfg.Receipts.Bucket, Expected: []string{"roster", "billing"}})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]services.Row{}
		for _, r := range rows {
			out[r.Service] = r
		}
		return out
	}
	if r := report()["roster"]; r.Failed != 1 || r.InSync != 0 || !r.Consumer {
		t.Errorf("student-bridge services while stubborn fails: %+v", r)
	}
	other := w.create(t, "other", "china")
	for _, s := range []*studentv1.Student{other, stubborn} {
		w.waitReceipt(t, "roster", s, applied(w.lastID(s)))
	}
	if err := stacktest.Eventually(10*time.Second, func() error {
		rows := report()
		if r := rows["roster"]; r.InSync != 2 || r.Behind != 0 || r.Failed != 0 || !r.Consumer || r.Pending != 0 || r.AckedSequence != 2 {
			return fmt.Errorf("roster: %+v", r)
		}
		if r := rows["billing"]; r.Behind != 2 || r.Consumer {
			return fmt.Errorf("billing (expected, never started): %+v", r)
		}
		return nil
	}); err != nil {
		t.Errorf("student-bridge services: %v", err)
	}
	var attempts []string
	for _, c := range rec.take() {
		attempts = append(attempts, c.Name)
	}
	if n := strings.Count(strings.Join(attempts, " "), "stubborn"); n < 4 || n != failures+1 {
		t.Errorf("handler calls %v: want stubborn %d failures, then applied once", attempts, failures)
	}
	if i, j := indexOf(attempts, "other"), lastIndexOf(attempts, "stubborn"); i < 0 || i > j {
		t.Errorf("handler calls %v: other was held back behind the failing stubborn", attempts)
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func lastIndexOf(s []string, v string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == v {
			return i
		}
	}
	return -1
}

// applied wants a receipt of the event id applied.
func applied(id string) func(studentv1.Receipt) error {
	return func(r studentv1.Receipt) error {
		if r.Result != studentv1.ResultApplied || r.EventID != id {
			return fmt.Errorf("receipt %+v, want %s applied", r, id)
		}
		return nil
	}
}

// waitReceipt waits until service's receipt for s meets cond.
func (w *world) waitReceipt(t *testing.T, service string, s *studentv1.Student, cond func(studentv1.Receipt) error) {
	t.Helper()
	js, err := jetstream.New(w.nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), w.cfg.Receipts.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	key := studentv1.ReceiptKey(service, string(s.UID))
	if err := stacktest.Eventually(30*time.Second, func() error {
		e, err := kv.Get(context.Background(), key)
		if err != nil {
			return err
		}
		r, err := studentv1.ParseReceipt(key, e.Value())
		if err != nil {
			return err
		}
		return cond(r)
	}); err != nil {
		t.Fatalf("%s's receipt for %s: %v", service, s.Name, err)
	}
}

// TestMirrorAsksForASnapshot: when events the service never saw have left
// the stream (here its message limit; in a deployment its maxAge), the
// rebuild asks the bridge for a snapshot and still ends with every Student.
func TestMirrorAsksForASnapshot(t *testing.T) {
	t.Parallel()
	// 60 created (sequences 1-60), ten of them updated five times (61-110);
	// the stream keeps 80 events, so s10-s29 have none left. The snapshot
	// (60 more events) fits in what the stream keeps.
	w := newWorldWith(t, "aged", worldOptions{maxMsgs: 80})
	var students []*studentv1.Student
	for i := range 60 {
		students = append(students, w.create(t, fmt.Sprintf("s%02d", i), "china"))
	}
	w.waitPublished(t, 60)
	for round := range 5 {
		for _, s := range students[:10] {
			w.update(t, s, fmt.Sprintf("school-%d", round))
		}
		w.waitSequences(t, 0, uint64(60+10*(round+1)))
	}
	w.waitSequences(t, 31, 110)
	rec := &recorder{}
	m, _ := w.mirror(t, "late", rec.handle)
	w.waitSame(t, m)
	if n := len(rec.take()); n != 60 {
		t.Errorf("the rebuild handed over %d changes, want 60", n)
	}
}

// TestMirrorCountsAGap: an event that left the stream between two events
// of a Student (deleted by hand here) shows as a gap in its sequence; the
// mirror counts it and applies the newest state all the same. The events
// of other Students in between are no gap.
func TestMirrorCountsAGap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, "gaps")
	x := w.create(t, "x", "china")
	w.create(t, "y", "china")
	w.waitPublished(t, 2)
	rec := &recorder{}
	m, stop := w.mirror(t, "gaps", rec.handle)
	w.waitSame(t, m)
	w.waitAcked(t, "gaps", 2)
	stop()
	if n := m.Gaps(); n != 0 {
		t.Errorf("%d gaps in events that are all there", n)
	}

	for _, school := range []string{"beijing", "shanghai"} {
		w.update(t, x, school)
	}
	w.waitPublished(t, 4)
	js, err := jetstream.New(w.nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, w.cfg.NATS.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.DeleteMsg(ctx, 3); err != nil { // x's update to beijing
		t.Fatal(err)
	}
	m, stop = w.mirror(t, "gaps", rec.handle)
	if got := w.waitSame(t, m); got[string(x.UID)] != "x=shanghai" {
		t.Errorf("mirror holds %q for x, want its newest state", got[string(x.UID)])
	}
	if n := m.Gaps(); n != 1 {
		t.Errorf("the mirror counted %d gaps, want 1", n)
	}
	w.waitAcked(t, "gaps", 4)
	stop()

	// A snapshot carries the number of the Student's last change: x's
	// update to wuhan (its number 4) leaves the stream, so the snapshot
	// that follows, numbered 4 too, is one above the last change the
	// mirror read (3). y's snapshot, numbered as its created event, is no
	// gap.
	w.update(t, x, "wuhan")
	w.waitSequences(t, 1, 5)
	if err := stream.DeleteMsg(ctx, 5); err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(studentv1.SnapshotRequest{Namespace: w.ns})
	if _, err := w.nc.Request(w.cfg.Snapshot.RequestSubject, body, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	w.waitSequences(t, 1, 7)
	m, _ = w.mirror(t, "gaps", rec.handle)
	if got := w.waitSame(t, m); got[string(x.UID)] != "x=wuhan" {
		t.Errorf("mirror holds %q for x, want its state in the snapshot", got[string(x.UID)])
	}
	// The rebuild reads the stream from its start again: the first gap
	// (x's 1 to 3) and the snapshot's (x's 3 to 4).
	if n := m.Gaps(); n != 2 {
		t.Errorf("the mirror counted %d gaps, want 2: the deleted update, and the snapshot one above the last change read", n)
	}
}

// TestMirrorOutlastsMissedHeartbeats: the Mirror's connection stalls for
// longer than two of its consumer's heartbeats (as while the consumer's
// leader moves to another node of a cluster), without breaking. Once it
// flows again, the Mirror goes on with the next change.
func TestMirrorOutlastsMissedHeartbeats(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "stall")
	w.create(t, "x", "china")
	w.waitPublished(t, 1)
	link, err := stack.NewLink(strings.TrimPrefix(server.URL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(link.Close)
	nc, err := nats.Connect("nats://" + link.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	rec := &recorder{}
	var log stacktest.Buffer
	m, _ := w.mirrorOn(t, nc, "stall", rec.handle, func(o *consumer.MirrorOptions) { o.Logger = slog.New(slog.NewTextHandler(&log, nil)) })
	w.waitSame(t, m)

	// Stalled (what the server sends arrives 12 s late) until the Mirror
	// says its consumer missed its heartbeats (two, 5 s apart).
	link.SetDelay(12 * time.Second)
	stacktest.WaitFor(t, "the Mirror to miss its consumer's heartbeats", func() error {
		if !strings.Contains(log.String(), "missed its heartbeats") {
			return errors.New("not yet")
		}
		return nil
	})
	link.SetDelay(0)
	w.create(t, "y", "beijing")
	w.waitSame(t, m)
}

// TestMirrorEndsWhenItsConsumerIsGone: a durable consumer deleted by hand
// ends Run with an error that says so.
func TestMirrorEndsWhenItsConsumerIsGone(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "gone")
	w.create(t, "x", "china")
	w.waitPublished(t, 1)
	m, err := consumer.NewMirror(w.nc, w.options("gone", (&recorder{}).handle, func(o *consumer.MirrorOptions) { o.SnapshotSubject = consumer.NoSnapshots }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	w.waitSame(t, m)
	js, err := jetstream.New(w.nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteConsumer(ctx, w.cfg.NATS.Stream.Name, "gone"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "durable consumer gone is gone") {
			t.Fatalf("Run ended with %v, want it to say the durable consumer is gone", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run goes on a minute after its durable consumer was deleted")
	}
}
