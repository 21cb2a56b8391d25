package reconciler_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"testing"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/records"
	"github.com/student-bridge/student-bridge/internal/sinktest"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/reconciler"
	"github.com/student-bridge/student-bridge/sink"
)

// These tests drive Reconcile directly, one call at a time, against a real
// API server, with in-memory fakes of the sink interfaces: how a change, a
// delete and a failure are handled, readable step by step.

var st *stack.Stack

func TestMain(m *testing.M) {
	reconciler.RegisterMetrics()
	os.Exit(stacktest.RunTests(m, stack.Options{}, func(s *stack.Stack) { st = s }))
}

// fixture is one reconciler with its fakes, in a namespace of its own.
type fixture struct {
	t     *testing.T
	ns    string
	sink  *sinktest.Sink
	store *sinktest.Store
	// deps and opts are what build makes the reconciler from.
	deps reconciler.Deps
	opts reconciler.Options
	r    *reconciler.StudentReconciler
}

func newFixture(t *testing.T, holdWithFinalizer bool) *fixture {
	t.Helper()
	f := &fixture{t: t, ns: stacktest.Namespace(t, st.Client, "rec"), sink: &sinktest.Sink{}, store: &sinktest.Store{}}
	f.deps = reconciler.Deps{Client: st.Client, Sink: f.sink, Records: records.New()}
	f.opts = reconciler.Options{HoldWithFinalizer: holdWithFinalizer, Recorder: nopRecorder{}, Cluster: "test"}
	f.build()
	f.load()
	return f
}

// build makes the reconciler from f.deps and f.opts. A test that changes
// them builds it again: New's reconciler does not change.
func (f *fixture) build() {
	f.t.Helper()
	r, err := reconciler.New(f.deps, f.opts)
	if err != nil {
		f.t.Fatal(err)
	}
	f.r = r
}

// load (re)loads the records from the store, as a bridge does at start.
func (f *fixture) load() {
	f.t.Helper()
	if err := f.deps.Records.Load(context.Background(), f.store); err != nil {
		f.t.Fatal(err)
	}
}

// restart is a new bridge: a new reconciler whose records are loaded from
// the store.
func (f *fixture) restart() {
	f.t.Helper()
	f.deps.Records = records.New()
	f.build()
	f.load()
}

// publishVia makes the reconciler publish through p.
func (f *fixture) publishVia(p sink.Sink) {
	f.t.Helper()
	f.deps.Sink = p
	f.build()
}

func (f *fixture) create(name string, labels map[string]string) *studentv1.Student {
	f.t.Helper()
	s := &studentv1.Student{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: labels},
		Spec:       studentv1.StudentSpec{Name: "wang", School: "china"},
	}
	if err := st.Client.Create(context.Background(), s); err != nil {
		f.t.Fatal(err)
	}
	return s
}

func (f *fixture) get(name string) *studentv1.Student {
	f.t.Helper()
	var s studentv1.Student
	if err := st.Client.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: name}, &s); err != nil {
		f.t.Fatal(err)
	}
	return &s
}

func (f *fixture) update(name string, change func(*studentv1.Student)) {
	f.t.Helper()
	s := f.get(name)
	change(s)
	if err := st.Client.Update(context.Background(), s); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) delete(name string) {
	f.t.Helper()
	if err := st.Client.Delete(context.Background(), &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) reconcile(name string) error {
	_, err := f.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: f.ns, Name: name}})
	return err
}

func (f *fixture) mustReconcile(name string) {
	f.t.Helper()
	if err := f.reconcile(name); err != nil {
		f.t.Fatalf("reconcile %s: %v", name, err)
	}
}

// withWatch is a client of the API server to wrap with an interceptor.
func (f *fixture) withWatch() client.WithWatch {
	f.t.Helper()
	c, err := client.NewWithWatch(st.RestConfig, client.Options{Scheme: st.Client.Scheme()})
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// events returns the types of the published events, in order.
func (f *fixture) events() []string {
	var out []string
	for _, ev := range f.sink.Events() {
		out = append(out, studentv1.Operation(ev.Type()))
	}
	return out
}

func (f *fixture) requireEvents(want ...string) []cloudevents.Event {
	f.t.Helper()
	if got := f.events(); fmt.Sprint(got) != fmt.Sprint(want) {
		f.t.Fatalf("published %v, want %v", got, want)
	}
	return f.sink.Events()
}

func data(t *testing.T, ev cloudevents.Event) studentv1.StudentEventData {
	t.Helper()
	var d studentv1.StudentEventData
	if err := ev.DataAs(&d); err != nil {
		t.Fatal(err)
	}
	return d
}

func (f *fixture) record(uid types.UID) (studentv1.StudentRecord, bool) {
	f.t.Helper()
	rec, err := f.store.Get(context.Background(), string(uid))
	if errors.Is(err, sink.ErrNotFound) {
		return studentv1.StudentRecord{}, false
	}
	if err != nil {
		f.t.Fatal(err)
	}
	var sr studentv1.StudentRecord
	if err := json.Unmarshal(rec.Value, &sr); err != nil {
		f.t.Fatal(err)
	}
	return sr, true
}

// TestLifecycle: create, update, relabel, no-op, delete with the finalizer
// policy: one event each, the record follows, and the Student is held until
// its deleted event is out.
func TestLifecycle(t *testing.T) {
	f := newFixture(t, true)
	stu := f.create("object-name", nil)

	f.mustReconcile("object-name")
	if !controllerutil.ContainsFinalizer(f.get("object-name"), studentv1.Finalizer) {
		t.Error("no finalizer after the first reconcile")
	}
	created := f.requireEvents("created")[0]
	if rec, ok := f.record(stu.UID); !ok || rec.Pending || rec.Published.ID != created.ID() || rec.Published.Sequence != 1 {
		t.Errorf("record after created: %+v (found %v)", rec, ok)
	}

	f.update("object-name", func(s *studentv1.Student) { s.Spec.School = "beijing" })
	f.mustReconcile("object-name")
	f.update("object-name", func(s *studentv1.Student) { s.Labels = map[string]string{"year": "2"} })
	f.mustReconcile("object-name")
	f.update("object-name", func(s *studentv1.Student) { s.Annotations = map[string]string{"note": "not a change"} })
	f.mustReconcile("object-name")
	evs := f.requireEvents("created", "updated", "updated")
	if d := data(t, evs[1]); d.Spec.School != "beijing" || d.PreviousSpec == nil || d.PreviousSpec.School != "china" {
		t.Errorf("updated data: spec %+v previous %+v", d.Spec, d.PreviousSpec)
	}
	if d := data(t, evs[2]); d.Metadata.Labels["year"] != "2" {
		t.Errorf("relabel data: labels %v", d.Metadata.Labels)
	}

	f.delete("object-name")
	if f.get("object-name").DeletionTimestamp.IsZero() {
		t.Fatal("the finalizer did not hold the Student")
	}
	f.mustReconcile("object-name")
	evs = f.requireEvents("created", "updated", "updated", "deleted")
	if d := data(t, evs[3]); d.Spec.School != "beijing" || d.Metadata.Labels["year"] != "2" {
		t.Errorf("deleted event does not carry the final state: %+v", d)
	}
	if err := st.Client.Get(context.Background(), client.ObjectKeyFromObject(stu), &studentv1.Student{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Student is still there after its deleted event: %v", err)
	}
	if _, ok := f.record(stu.UID); ok {
		t.Error("the record outlived the Student")
	}
	f.mustReconcile("object-name")
	requireChain(t, f.requireEvents("created", "updated", "updated", "deleted"), 1)
}

// requireChain fails unless evs are one Student's events numbered from
// first on, each naming the one before it (a first created names none).
func requireChain(t *testing.T, evs []cloudevents.Event, first int64) {
	t.Helper()
	for i, ev := range evs {
		seq, ok := studentv1.ParseSequence(ev.Extensions()[studentv1.ExtensionSequence])
		prev, _ := ev.Extensions()[studentv1.ExtensionPreviousID].(string)
		wantPrev := ""
		if i > 0 {
			wantPrev = evs[i-1].ID()
		}
		if !ok || seq != first+int64(i) || (i > 0 || ev.Type() == studentv1.EventTypeCreated) && prev != wantPrev {
			t.Errorf("event %d (%s): sequence %v previousid %q, want %d and %q", i, ev.Type(), ev.Extensions()[studentv1.ExtensionSequence], prev, first+int64(i), wantPrev)
		}
	}
}

// TestSequenceSurvivesRestart: a reconciler that loads the records of an
// earlier one counts on where it stopped.
func TestSequenceSurvivesRestart(t *testing.T) {
	f := newFixture(t, true)
	f.create("a", nil)
	f.mustReconcile("a")
	f.restart()
	f.update("a", func(s *studentv1.Student) { s.Spec.School = "beijing" })
	f.mustReconcile("a")
	f.delete("a")
	f.mustReconcile("a")
	requireChain(t, f.requireEvents("created", "updated", "deleted"), 1)
}

// TestSequenceAfterPendingFirstEvent: a Student whose first event may be
// out (its record pending: the ack was lost) and is then deleted gets a
// deleted event numbered after it, never a second 1.
func TestSequenceAfterPendingFirstEvent(t *testing.T) {
	f := newFixture(t, true)
	stu := f.create("early", nil)
	f.publishVia(sinkFunc(func(ctx context.Context, ev cloudevents.Event) (sink.Receipt, error) {
		_, _ = f.sink.Publish(ctx, ev) // out, but the ack is lost
		return sink.Receipt{}, errors.New("ack lost")
	}))
	if err := f.reconcile("early"); err == nil {
		t.Fatal("reconcile succeeded without an ack")
	}
	if rec, _ := f.record(stu.UID); !rec.Pending {
		t.Fatalf("record after a lost ack: %+v, want pending", rec)
	}
	f.publishVia(f.sink)
	f.delete("early")
	f.mustReconcile("early")
	requireChain(t, f.requireEvents("created", "deleted"), 1)
}

// TestFailedPublishHoldsTheDelete: while the broker refuses, the deleted
// Student stays held and the error is returned for a retry.
func TestFailedPublishHoldsTheDelete(t *testing.T) {
	f := newFixture(t, true)
	f.create("held", nil)
	f.mustReconcile("held")
	f.delete("held")

	f.sink.Fail(fmt.Errorf("%w: broker down", sink.ErrNotConnected))
	if err := f.reconcile("held"); !errors.Is(err, sink.ErrNotConnected) {
		t.Fatalf("reconcile while the broker is down: %v, want ErrNotConnected", err)
	}
	if !controllerutil.ContainsFinalizer(f.get("held"), studentv1.Finalizer) {
		t.Fatal("the finalizer was removed although the deleted event is not out")
	}
	f.sink.Fail(nil)
	f.mustReconcile("held")
	f.requireEvents("created", "deleted")
}

// TestDeletedWithoutFinalizer: with the policy off the bridge writes nothing
// to the Student, and a delete it did not see (no watch here) is published
// from the record, with the last published state.
func TestDeletedWithoutFinalizer(t *testing.T) {
	f := newFixture(t, false)
	stu := f.create("free", nil)
	f.mustReconcile("free")
	if s := f.get("free"); len(s.Finalizers) != 0 || s.ResourceVersion != stu.ResourceVersion {
		t.Errorf("the bridge wrote to the Student: finalizers %v, resourceVersion %s -> %s", s.Finalizers, stu.ResourceVersion, s.ResourceVersion)
	}
	f.delete("free")
	f.mustReconcile("free")
	evs := f.requireEvents("created", "deleted")
	if d := data(t, evs[1]); d.Metadata.UID != string(stu.UID) || d.Spec != stu.Spec {
		t.Errorf("deleted event: %+v", d)
	}
	if _, ok := f.record(stu.UID); ok {
		t.Error("the record outlived the Student")
	}
}

// TestReplacedWhileAway: a Student deleted and created again under the same
// name between two reconciles gets the old one's deleted, then its own
// created.
func TestReplacedWhileAway(t *testing.T) {
	f := newFixture(t, false)
	old := f.create("again", nil)
	f.mustReconcile("again")
	f.delete("again")
	replacement := f.create("again", map[string]string{"round": "2"})
	f.mustReconcile("again")
	evs := f.requireEvents("created", "deleted", "created")
	if data(t, evs[1]).Metadata.UID != string(old.UID) || data(t, evs[2]).Metadata.UID != string(replacement.UID) {
		t.Errorf("uids: deleted %s, created %s; want %s then %s", data(t, evs[1]).Metadata.UID, data(t, evs[2]).Metadata.UID, old.UID, replacement.UID)
	}
}

// TestTooLargeIsTerminal: an event the broker will never take is not
// retried; the Student waits for a change.
func TestTooLargeIsTerminal(t *testing.T) {
	f := newFixture(t, false)
	f.create("huge", nil)
	f.sink.Fail(fmt.Errorf("%w: 3 MB", sink.ErrTooLarge))
	err := f.reconcile("huge")
	if !errors.Is(err, reconcile.TerminalError(nil)) || !errors.Is(err, sink.ErrTooLarge) {
		t.Fatalf("reconcile: %v, want a terminal error wrapping ErrTooLarge", err)
	}
	view := f.r.View(f.get("huge"))
	if c := findPublished(view); c == nil || c.Status != metav1.ConditionFalse || c.Reason != studentv1.ReasonInvalid {
		t.Errorf("status view's Published condition: %+v", c)
	}
}

// TestRecordStoreFailureClosesPublishing: an event acknowledged but not
// recorded is kept in memory, not published again, and nothing new goes out
// until the store takes the record.
func TestRecordStoreFailureClosesPublishing(t *testing.T) {
	f := newFixture(t, false)
	first := f.create("first", nil)
	f.create("second", nil)
	f.mustReconcile("first")

	f.update("first", func(s *studentv1.Student) { s.Spec.School = "beijing" })
	// The store fails once the update is acknowledged: its reservation
	// was written, its record after the ack is not.
	f.sink.Acked = func(cloudevents.Event) { f.store.Fail(fmt.Errorf("%w: bucket unavailable", sink.ErrNotConnected)) }
	if err := f.reconcile("first"); err == nil {
		t.Fatal("reconcile succeeded while the record store refused the write")
	}
	f.sink.Acked = nil
	f.requireEvents("created", "updated")
	if err := f.reconcile("first"); err == nil {
		t.Fatal("second reconcile succeeded while the record store refused the write")
	}
	if err := f.reconcile("second"); err == nil {
		t.Fatal("a new Student was handled while a record waits for the store")
	}
	f.requireEvents("created", "updated")

	f.store.Fail(nil)
	f.mustReconcile("second")
	f.mustReconcile("first")
	f.requireEvents("created", "updated", "created")
	if rec, ok := f.record(first.UID); !ok || rec.Published.Type != studentv1.EventTypeUpdated {
		t.Errorf("record of first after the store came back: %+v", rec)
	}
}

// TestRestartRepublishesNothing: a reconciler that loads the records of an
// earlier one publishes nothing for unchanged Students.
func TestRestartRepublishesNothing(t *testing.T) {
	f := newFixture(t, true)
	for _, n := range []string{"a", "b"} {
		f.create(n, nil)
		f.mustReconcile(n)
	}
	f.restart()
	f.mustReconcile("a")
	f.mustReconcile("b")
	f.requireEvents("created", "created")
}

// TestWriteAhead: a Student's first event is recorded as pending before it
// goes out, so a bridge that stops right after the publish still knows it.
func TestWriteAhead(t *testing.T) {
	f := newFixture(t, false)
	stu := f.create("early", nil)
	var seen *studentv1.StudentRecord
	f.publishVia(sinkFunc(func(ctx context.Context, ev cloudevents.Event) (sink.Receipt, error) {
		if rec, ok := f.record(stu.UID); ok {
			seen = &rec
		}
		return f.sink.Publish(ctx, ev)
	}))
	f.mustReconcile("early")
	if seen == nil || !seen.Pending || seen.Published.Type != studentv1.EventTypeCreated {
		t.Fatalf("record while the first event went out: %+v", seen)
	}
	if rec, _ := f.record(stu.UID); rec.Pending {
		t.Error("record still pending after the ack")
	}
}

type sinkFunc func(context.Context, cloudevents.Event) (sink.Receipt, error)

func (f sinkFunc) Publish(ctx context.Context, ev cloudevents.Event) (sink.Receipt, error) {
	return f(ctx, ev)
}

type nopRecorder struct{}

func (nopRecorder) Eventf(_, _ runtime.Object, _, _, _, _ string, _ ...any) {}

func findPublished(s studentv1.StudentStatus) *metav1.Condition {
	for i := range s.Conditions {
		if s.Conditions[i].Type == studentv1.ConditionPublished {
			return &s.Conditions[i]
		}
	}
	return nil
}

// TestPendingIsNotPublished: while a Student's first event is out and not
// acknowledged (its record pending), the status view does not say it is
// published.
func TestPendingIsNotPublished(t *testing.T) {
	f := newFixture(t, false)
	f.create("early", nil)
	var during *metav1.Condition
	f.publishVia(sinkFunc(func(ctx context.Context, ev cloudevents.Event) (sink.Receipt, error) {
		during = findPublished(f.r.View(f.get("early")))
		return f.sink.Publish(ctx, ev)
	}))
	f.mustReconcile("early")
	if during == nil || during.Status == metav1.ConditionTrue {
		t.Errorf("Published condition while the first event was pending: %+v, want not True", during)
	}
	if c := findPublished(f.r.View(f.get("early"))); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Published condition after the ack: %+v, want True", c)
	}
}

// owner is a ShardOwner holding every shard until one is lost.
type owner struct {
	lost []types.NamespacedName
}

func (o *owner) Owns(key types.NamespacedName) bool { return !o.isLost(key) }

func (o *owner) Begin(key types.NamespacedName) (func(), bool) { return func() {}, !o.isLost(key) }

func (o *owner) Lost(key types.NamespacedName) { o.lost = append(o.lost, key) }

func (o *owner) isLost(key types.NamespacedName) bool {
	for _, k := range o.lost {
		if k == key {
			return true
		}
	}
	return false
}

// TestConflictGivesUpTheShard: when another replica wrote a Student's
// record (it holds the shard now), the next publish's reservation
// conflicts before its event goes out, and the first such conflict gives
// the shard up: nothing is published for it here, then or later.
func TestConflictGivesUpTheShard(t *testing.T) {
	f := newFixture(t, false)
	o := &owner{}
	f.opts.Shards = o
	f.build()
	stu := f.create("s", nil)
	f.mustReconcile("s")
	f.requireEvents("created")

	// The new holder's write.
	rec, err := f.store.Get(context.Background(), string(stu.UID))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Put(context.Background(), rec.Key, rec.Value, rec.Revision); err != nil {
		t.Fatal(err)
	}

	f.update("s", func(s *studentv1.Student) { s.Spec.School = "peking" })
	if err := f.reconcile("s"); !errors.Is(err, sink.ErrConflict) {
		t.Fatalf("reconcile after another replica's write: %v, want a conflict", err)
	}
	key := types.NamespacedName{Namespace: f.ns, Name: "s"}
	if fmt.Sprint(o.lost) != fmt.Sprint([]types.NamespacedName{key}) {
		t.Fatalf("shards lost %v, want %v's", o.lost, key)
	}
	f.update("s", func(s *studentv1.Student) { s.Spec.School = "tsinghua" })
	f.mustReconcile("s")
	f.requireEvents("created")
}

// TestCacheBehindPublishesNothingOlder: a replica that takes over a
// shard while its cache is behind the previous holder's publishes nothing
// for the older state it shows: neither an update back to it, nor a new
// created after a published delete, whether the deleted Student's record
// is still there or already removed. Its watch brings the newer state,
// which is published already.
func TestCacheBehindPublishesNothingOlder(t *testing.T) {
	for _, tc := range []struct {
		name string
		// change changes the Student "lagging", created and published,
		// and returns the state of it a lagging cache shows.
		change func(f *fixture, created *studentv1.Student) *studentv1.Student
		want   []string
	}{
		{"updated twice", func(f *fixture, created *studentv1.Student) *studentv1.Student {
			f.update("lagging", func(s *studentv1.Student) { s.Spec.School = "beijing" })
			f.mustReconcile("lagging")
			f.update("lagging", func(s *studentv1.Student) { s.Spec.School = "shanghai" })
			f.mustReconcile("lagging")
			return created
		}, []string{"created", "updated", "updated"}},
		{"deleted, its record still there", func(f *fixture, created *studentv1.Student) *studentv1.Student {
			// The finalizer's removal fails, so the record says deleted
			// while the Student is still there.
			f.delete("lagging")
			f.deps.Client = interceptor.NewClient(f.withWatch(), interceptor.Funcs{
				Patch: func(context.Context, client.WithWatch, client.Object, client.Patch, ...client.PatchOption) error {
					return errors.New("the API server is away")
				},
			})
			f.build()
			if err := f.reconcile("lagging"); err == nil {
				t.Fatal("reconcile succeeded without removing the finalizer")
			}
			return created
		}, []string{"created", "deleted"}},
		{"updated, deleted and its record removed", func(f *fixture, _ *studentv1.Student) *studentv1.Student {
			f.update("lagging", func(s *studentv1.Student) { s.Spec.School = "beijing" })
			f.mustReconcile("lagging")
			updated := f.get("lagging")
			f.delete("lagging")
			f.mustReconcile("lagging")
			if _, ok := f.record(updated.UID); ok {
				t.Fatal("the record outlived the Student")
			}
			return updated
		}, []string{"created", "updated", "deleted"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, true)
			f.create("lagging", nil)
			f.mustReconcile("lagging")
			lagging := tc.change(f, f.get("lagging"))
			f.requireEvents(tc.want...)

			// Another replica takes the shard over: it loads the records
			// the first one wrote, and its cache shows the older state.
			behind := interceptor.NewClient(f.withWatch(), interceptor.Funcs{
				Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					if s, ok := obj.(*studentv1.Student); ok && key.Name == "lagging" {
						lagging.DeepCopyInto(s)
						return nil
					}
					return c.Get(ctx, key, obj, opts...)
				},
			})
			f.deps.Client, f.deps.APIReader = behind, st.Client
			f.opts.Shards = &owner{}
			f.restart()
			f.mustReconcile("lagging")
			f.requireEvents(tc.want...)
		})
	}
}

// TestCacheBehindIsNotAScopeExit: a Student the reconciler's cache does
// not have (yet: a relist, a shard gained late) but the API server does
// is looked at again, never published as having left the scope, when it
// is in the watched scope, with namespaces set too. Out of the scope (its
// namespace no longer watched) it did leave: deleted is published.
func TestCacheBehindIsNotAScopeExit(t *testing.T) {
	for _, tc := range []struct {
		name       string
		namespaces func(ns string) []string
		left       bool
	}{
		{"every namespace watched", func(string) []string { return nil }, false},
		{"its namespace watched", func(ns string) []string { return []string{"elsewhere", ns} }, false},
		{"its namespace no longer watched", func(string) []string { return []string{"elsewhere"} }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, true)
			f.create("lagging", nil)
			f.mustReconcile("lagging")
			f.requireEvents("created")

			// The cache lacks it; the API server has it.
			behind := interceptor.NewClient(f.withWatch(), interceptor.Funcs{
				Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					if _, ok := obj.(*studentv1.Student); ok && key.Name == "lagging" {
						return apierrors.NewNotFound(studentv1.GroupVersion.WithResource("students").GroupResource(), key.Name)
					}
					return c.Get(ctx, key, obj, opts...)
				},
			})
			f.deps.Client, f.deps.APIReader = behind, st.Client
			f.opts.Namespaces = tc.namespaces(f.ns)
			f.opts.InScope = reconciler.Scope(f.opts.Namespaces, labels.Everything())
			f.build()

			res, err := f.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: f.ns, Name: "lagging"}})
			if err != nil {
				t.Fatal(err)
			}
			if tc.left {
				f.requireEvents("created", "deleted")
				return
			}
			f.requireEvents("created")
			if res.RequeueAfter == 0 {
				t.Error("a Student the cache is behind on is not looked at again")
			}
			if !controllerutil.ContainsFinalizer(f.get("lagging"), studentv1.Finalizer) {
				t.Error("the finalizer was removed from a Student in the watched scope")
			}
		})
	}
}
