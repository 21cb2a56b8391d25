package records_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/records"
	"github.com/student-bridge/student-bridge/internal/sinktest"
	"github.com/student-bridge/student-bridge/sink"
)

// loaded is a Set loaded from store, as a bridge's at its start.
func loaded(t *testing.T, store sink.Store) *records.Set {
	t.Helper()
	recs := records.New()
	if err := recs.Load(context.Background(), store); err != nil {
		t.Fatal(err)
	}
	return recs
}

// savedAB saves the created records of Students a and b in recs, and
// returns how the test makes a record of uid and event type typ.
func savedAB(t *testing.T, recs *records.Set) func(uid, typ string) studentv1.StudentRecord {
	t.Helper()
	rec := func(uid, typ string) studentv1.StudentRecord {
		return studentv1.StudentRecord{Namespace: "ns", Name: uid, UID: types.UID(uid), Published: studentv1.PublishedEvent{Type: typ, ID: uid + "-" + typ}}
	}
	for _, uid := range []string{"a", "b"} {
		if err := recs.Save(context.Background(), rec(uid, studentv1.EventTypeCreated)); err != nil {
			t.Fatal(err)
		}
	}
	return rec
}

// gatedStore holds every Delete until release is closed, telling deleting
// when one arrives.
type gatedStore struct {
	*sinktest.Store
	deleting chan struct{}
	release  chan struct{}
}

func (s *gatedStore) Delete(ctx context.Context, key string, revision uint64) error {
	s.deleting <- struct{}{}
	<-s.release
	return s.Store.Delete(ctx, key, revision)
}

// TestRemoveHoldsUpNoOtherStudent: while one Student's record is being
// deleted from the store, the records of the others are read and written:
// every reconcile reads them, and the bridge must not wait on one delete's
// round trip.
func TestRemoveHoldsUpNoOtherStudent(t *testing.T) {
	ctx := context.Background()
	store := &gatedStore{Store: &sinktest.Store{}, deleting: make(chan struct{}), release: make(chan struct{})}
	recs := loaded(t, store)
	rec := savedAB(t, recs)

	removed := make(chan error, 1)
	go func() { removed <- recs.Remove(ctx, "a") }()
	<-store.deleting
	others := make(chan error, 1)
	go func() {
		if _, ok := recs.Get("b"); !ok {
			others <- errors.New("b's record is gone")
			return
		}
		others <- recs.Save(ctx, rec("b", studentv1.EventTypeUpdated))
	}()
	// A bound that only a lock held across the delete reaches.
	select {
	case err := <-others:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		close(store.release)
		t.Fatal("reading and writing b's record waited for a's delete")
	}
	close(store.release)
	if err := <-removed; err != nil {
		t.Fatal(err)
	}
	if _, ok := recs.Get("a"); ok {
		t.Error("a's record is still held after its removal")
	}
	if got, _ := recs.Get("b"); got.Published.Type != studentv1.EventTypeUpdated {
		t.Errorf("b's record says %q, want %q", got.Published.Type, studentv1.EventTypeUpdated)
	}
	if keys := store.Keys(); len(keys) != 1 || keys[0] != "b" {
		t.Errorf("the store holds %v, want [b]", keys)
	}
}

// stallingStore stops answering writes while stalled: a Put waits until
// release is closed (or its context ends), telling putting when it
// arrives, as a bucket whose leader froze.
type stallingStore struct {
	*sinktest.Store
	stalled atomic.Bool
	putting chan struct{}
	release chan struct{}
}

func (s *stallingStore) Put(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	if s.stalled.Load() {
		s.putting <- struct{}{}
		select {
		case <-s.release:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return s.Store.Put(ctx, key, value, revision)
}

// TestStalledFlushHoldsUpNoOtherStudent: while the record store does not
// answer the flush of a record held back by an outage, the other
// Students' records are read (every reconcile and the informer's
// transform read them), and another reconcile's flush answers at once
// instead of queueing behind it. Once the store answers, the held-back
// record is written and nothing is left unsaved.
func TestStalledFlushHoldsUpNoOtherStudent(t *testing.T) {
	ctx := context.Background()
	store := &stallingStore{Store: &sinktest.Store{}, putting: make(chan struct{}, 1), release: make(chan struct{})}
	recs := loaded(t, store)
	rec := savedAB(t, recs)
	store.Fail(errors.New("no responders"))
	if err := recs.Save(ctx, rec("a", studentv1.EventTypeUpdated)); err == nil {
		t.Fatal("a save to a failing store succeeded")
	}
	store.Fail(nil)
	store.stalled.Store(true)

	flushed := make(chan error, 1)
	go func() { flushed <- recs.Flush(ctx) }()
	<-store.putting
	others := make(chan error, 1)
	go func() {
		if got, ok := recs.Get("b"); !ok || got.Published.Type != studentv1.EventTypeCreated {
			others <- fmt.Errorf("b's record is %+v (held: %v)", got, ok)
			return
		}
		if n := len(recs.ForName(types.NamespacedName{Namespace: "ns", Name: "b"}, nil)); n != 1 {
			others <- fmt.Errorf("%d records named b", n)
			return
		}
		recs.Share(&studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b", UID: "b"}})
		if err := recs.Flush(ctx); err == nil {
			others <- errors.New("a second flush succeeded while the first one's write hung")
			return
		}
		others <- nil
	}()
	// A bound that only a lock held across the stalled write reaches.
	select {
	case err := <-others:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(10 * time.Second):
		t.Error("reading b's record or flushing again waited for the stalled write of a's")
	}
	store.stalled.Store(false)
	close(store.release)
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	if n := recs.Unsaved(); n != 0 {
		t.Errorf("%d records unsaved after the store answered", n)
	}
	stored, err := recs.Stored(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sr := range stored {
		if sr.UID == "a" && sr.Published.Type != studentv1.EventTypeUpdated {
			t.Errorf("the store holds a's %q record, want %q", sr.Published.Type, studentv1.EventTypeUpdated)
		}
	}
}

// garbledStore serves the values of the keys in garbled as bytes no record
// decodes from, at their true revisions.
type garbledStore struct {
	*sinktest.Store
	garbled map[string]bool
}

func (s *garbledStore) Load(ctx context.Context) ([]sink.Record, error) {
	all, err := s.Store.Load(ctx)
	for i := range all {
		if s.garbled[all[i].Key] {
			all[i].Value = []byte("not a record")
		}
	}
	return all, err
}

// TestReloadWhereTakesWhatOthersWrote: a replica that gains Students takes
// the records another replica wrote, created and removed since it loaded,
// and leaves those of the others as they are. What it holds at the
// store's revision it does not decode again: a garbled value at that
// revision does not reach it.
func TestReloadWhereTakesWhatOthersWrote(t *testing.T) {
	ctx := context.Background()
	store := &garbledStore{Store: &sinktest.Store{}, garbled: map[string]bool{}}
	rec := func(name, typ string) studentv1.StudentRecord {
		return studentv1.StudentRecord{Namespace: "ns", Name: name, UID: types.UID(name), Published: studentv1.PublishedEvent{Type: typ, ID: name + "-" + typ}}
	}
	other := loaded(t, store) // the replica that held the Students
	for _, name := range []string{"kept", "changed", "removed", "elsewhere"} {
		if err := other.Save(ctx, rec(name, studentv1.EventTypeCreated)); err != nil {
			t.Fatal(err)
		}
	}
	recs := loaded(t, store) // the replica that gains them
	if err := other.Save(ctx, rec("changed", studentv1.EventTypeUpdated)); err != nil {
		t.Fatal(err)
	}
	if err := other.Save(ctx, rec("new", studentv1.EventTypeCreated)); err != nil {
		t.Fatal(err)
	}
	if err := other.Remove(ctx, "removed"); err != nil {
		t.Fatal(err)
	}
	if err := other.Save(ctx, rec("elsewhere", studentv1.EventTypeUpdated)); err != nil {
		t.Fatal(err)
	}
	store.garbled["kept"] = true

	gained := func(r studentv1.StudentRecord) bool { return r.Name != "elsewhere" }
	if err := recs.ReloadWhere(ctx, gained); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"kept":      studentv1.EventTypeCreated,
		"changed":   studentv1.EventTypeUpdated,
		"new":       studentv1.EventTypeCreated,
		"elsewhere": studentv1.EventTypeCreated, // not gained: as it was
	} {
		if got, ok := recs.Get(types.UID(name)); !ok || got.Published.Type != want {
			t.Errorf("%s: holds %q (held %v), want %q", name, got.Published.Type, ok, want)
		}
	}
	if got, ok := recs.Get("removed"); ok {
		t.Errorf("removed: still held, as %q", got.Published.Type)
	}
}

// TestShareHoldsStringsOnce: a Student on its way into the cache takes
// its record's strings where they are equal, keeping every value; where
// they differ (a spec changed since its publish) it keeps its own.
func TestShareHoldsStringsOnce(t *testing.T) {
	ctx := context.Background()
	store := &sinktest.Store{}
	writer := loaded(t, store)
	if err := writer.Save(ctx, studentv1.StudentRecord{Namespace: "ns", Name: "wang", UID: "uid-1",
		Published: studentv1.PublishedEvent{Type: studentv1.EventTypeCreated, ID: "0123abcd", Spec: studentv1.StudentSpec{Name: "wang", School: "china"}}}); err != nil {
		t.Fatal(err)
	}
	recs := loaded(t, store) // as a start reads them
	held, _ := recs.Get("uid-1")

	// Strings of its own, as a decoded watch event has.
	own := func(s string) string { return string([]byte(s)) }
	student := func(school string) *studentv1.Student {
		s := &studentv1.Student{Spec: studentv1.StudentSpec{Name: own("wang"), School: own(school)},
			Status: studentv1.StudentStatus{LastPublished: &studentv1.PublishedEvent{ID: own("0123abcd")}}}
		s.Name, s.Namespace, s.UID = own("wang"), "ns", types.UID(own("uid-1"))
		return s
	}
	sameBytes := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

	s := student("china")
	recs.Share(s)
	if s.Name != "wang" || s.UID != "uid-1" || s.Spec != (studentv1.StudentSpec{Name: "wang", School: "china"}) || s.Status.LastPublished.ID != "0123abcd" {
		t.Fatalf("shared into %+v: a value changed", s)
	}
	for what, pair := range map[string][2]string{
		"uid": {string(s.UID), string(held.UID)}, "name": {s.Name, held.Name}, "spec.name": {s.Spec.Name, held.Published.Spec.Name},
		"spec.school": {s.Spec.School, held.Published.Spec.School}, "lastPublished.id": {s.Status.LastPublished.ID, held.Published.ID},
	} {
		if !sameBytes(pair[0], pair[1]) {
			t.Errorf("%s: the Student holds %q apart from its record's", what, pair[0])
		}
	}

	changed := student("tsinghua")
	recs.Share(changed)
	if changed.Spec.School != "tsinghua" || !sameBytes(changed.Spec.Name, held.Published.Spec.Name) {
		t.Errorf("a changed school: shared into %+v, want tsinghua kept and the name shared", changed.Spec)
	}
}

// TestConflictWithAnOlderRecordKeepsTheNewer: the store took a write whose
// answer was lost (the first event's record, over its write-ahead), and
// the bridge, still holding the write-ahead, published the Student's
// second event. Its record's write conflicts; what the store holds is the
// first event's. The Set keeps the second, unsaved, and the next flush
// writes it: were the first adopted, the Student's next event would be
// numbered 2 again.
func TestConflictWithAnOlderRecordKeepsTheNewer(t *testing.T) {
	ctx := context.Background()
	store := &sinktest.Store{}
	recs := loaded(t, store)
	rec := func(id string, seq int64, pending bool) studentv1.StudentRecord {
		return studentv1.StudentRecord{Namespace: "ns", Name: "s", UID: "u", Pending: pending,
			Published: studentv1.PublishedEvent{Type: studentv1.EventTypeCreated, ID: id, StudentSequence: seq}}
	}
	if err := recs.Save(ctx, rec("first", 1, true)); err != nil {
		t.Fatal(err)
	}
	held, err := store.Get(ctx, "u")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Put(ctx, "u", []byte(`{"namespace":"ns","name":"s","uid":"u","published":{"type":"io.k8s.example.student.created","id":"first","studentSequence":1}}`), held.Revision); err != nil {
		t.Fatal(err)
	}
	if err := recs.Save(ctx, rec("second", 2, false)); !errors.Is(err, sink.ErrConflict) {
		t.Fatalf("the second record's write: %v, want a conflict", err)
	}
	if got, _ := recs.Get("u"); got.Published.ID != "second" || recs.Unsaved() != 1 {
		t.Fatalf("after the conflict the Set holds %s (%d unsaved), want the second, unsaved", got.Published.ID, recs.Unsaved())
	}
	if err := recs.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	stored, err := store.Get(ctx, "u")
	if err != nil || !strings.Contains(string(stored.Value), `"id":"second"`) {
		t.Errorf("the store holds %s, %v; want the second event's record", stored.Value, err)
	}
}

// TestReloadKeepsAnUnsavedNewerRecord: a record whose write failed (its
// event is out) survives a reload of its shard while the store holds an
// earlier number of the Student's events, and is written over it at the
// next flush; a newer record in the store (another replica published
// since) replaces it.
func TestReloadKeepsAnUnsavedNewerRecord(t *testing.T) {
	ctx := context.Background()
	store := &sinktest.Store{}
	recs := loaded(t, store)
	rec := func(id string, seq int64) studentv1.StudentRecord {
		return studentv1.StudentRecord{Namespace: "ns", Name: "s", UID: "u",
			Published: studentv1.PublishedEvent{Type: studentv1.EventTypeUpdated, ID: id, StudentSequence: seq}}
	}
	if err := recs.Save(ctx, rec("third", 3)); err != nil {
		t.Fatal(err)
	}
	store.Fail(fmt.Errorf("%w: no leader", sink.ErrUnavailable))
	if err := recs.Save(ctx, rec("fourth", 4)); err == nil {
		t.Fatal("the record was written while the store fails")
	}
	store.Fail(nil)
	all := func(studentv1.StudentRecord) bool { return true }
	if err := recs.ReloadWhere(ctx, all); err != nil {
		t.Fatal(err)
	}
	if got, _ := recs.Get("u"); got.Published.ID != "fourth" || recs.Unsaved() != 1 {
		t.Fatalf("after the reload the Set holds %s (%d unsaved), want the fourth, unsaved", got.Published.ID, recs.Unsaved())
	}
	if err := recs.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if stored, err := store.Get(ctx, "u"); err != nil || !strings.Contains(string(stored.Value), `"id":"fourth"`) {
		t.Fatalf("the store holds %s, %v; want the fourth event's record", stored.Value, err)
	}

	// Another replica published the fifth meanwhile: the store's is newer.
	store.Fail(fmt.Errorf("%w: no leader", sink.ErrUnavailable))
	if err := recs.Save(ctx, rec("fifth, here", 5)); err == nil {
		t.Fatal("the record was written while the store fails")
	}
	store.Fail(nil)
	other := loaded(t, store)
	if err := other.Save(ctx, rec("sixth, there", 6)); err != nil {
		t.Fatal(err)
	}
	if err := recs.ReloadWhere(ctx, all); err != nil {
		t.Fatal(err)
	}
	if got, _ := recs.Get("u"); got.Published.ID != "sixth, there" || recs.Unsaved() != 0 {
		t.Errorf("after the reload the Set holds %s (%d unsaved), want the store's sixth, nothing unsaved", got.Published.ID, recs.Unsaved())
	}
}

// TestGaugesSumTheProcessSets: a process that runs several bridges (the
// dev stack, the tests) shows in student_bridge_records the records of all
// their Sets, not those of whichever wrote last; a stopped bridge's Set
// takes its share out.
func TestGaugesSumTheProcessSets(t *testing.T) {
	records.RegisterMetrics()
	held := func() float64 {
		t.Helper()
		families, err := crmetrics.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() == "student_bridge_records" {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("student_bridge_records is not registered")
		return 0
	}
	before := held()
	a, b := loaded(t, &sinktest.Store{}), loaded(t, &sinktest.Store{})
	savedAB(t, a)
	savedAB(t, b)
	if got := held() - before; got != 4 {
		t.Errorf("two Sets of two records each: student_bridge_records moved by %v, want 4", got)
	}
	a.Forget()
	if got := held() - before; got != 2 {
		t.Errorf("one Set forgotten: student_bridge_records moved by %v, want 2", got)
	}
	b.Forget()
	if got := held() - before; got != 0 {
		t.Errorf("both Sets forgotten: student_bridge_records moved by %v, want 0", got)
	}
}
