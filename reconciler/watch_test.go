package reconciler

import (
	"context"
	"fmt"
	"testing"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/records"
	"github.com/student-bridge/student-bridge/internal/sinktest"
	"github.com/student-bridge/student-bridge/internal/statusview"
)

// owner is a ShardOwner that owns the Students of namespace "mine".
type owner struct{}

func (owner) Owns(key types.NamespacedName) bool { return key.Namespace == "mine" }
func (owner) Begin(types.NamespacedName) (func(), bool) {
	return func() {}, true
}
func (owner) Lost(types.NamespacedName) {}

func watched(ns string, generation int64, labels map[string]string, finalizers ...string) *studentv1.Student {
	return &studentv1.Student{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "wang", UID: types.UID(ns + "-uid"), Generation: generation,
			ResourceVersion: fmt.Sprint(generation), Labels: labels, Finalizers: finalizers},
		Spec: studentv1.StudentSpec{Name: "wang", School: "china"},
	}
}

// loadedReconciler is a reconciler whose records hold a created event of
// mine/wang at generation 1, with a status writer that writes nothing.
// It is made field by field, not by New: the watch handler reads no
// client, and this test starts no API server.
func loadedReconciler(t *testing.T) *StudentReconciler {
	t.Helper()
	r := &StudentReconciler{records: records.New(), shards: owner{}, sharded: true, holdWithFinalizer: true, status: statusview.NewWriter(nil, nil, statusview.WriterOptions{QPS: 1, Log: logr.Discard()})}
	if err := r.records.Load(context.Background(), &sinktest.Store{}); err != nil {
		t.Fatal(err)
	}
	stu := watched("mine", 1, nil)
	rec := studentv1.StudentRecord{Namespace: stu.Namespace, Name: stu.Name, UID: stu.UID,
		Published: studentv1.PublishedEvent{Type: studentv1.EventTypeCreated, ID: "e1", Generation: 1, Spec: stu.Spec}}
	if err := r.records.Save(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	return r
}

// state is what a reconciler remembers of the watch's events.
func (r *StudentReconciler) state() string {
	count := func(m interface {
		Range(func(any, any) bool)
	}) (n int) {
		m.Range(func(any, any) bool { n++; return true })
		return n
	}
	s := fmt.Sprintf("gone %d, seen %d, catch-up %d, records %d", count(&r.gone), count(&r.seen), r.catchUps.Pending(), r.records.Len())
	if r.status != nil {
		asked, unchanged := r.status.Waiting()
		s += fmt.Sprintf(", status asked %d+%d", asked, unchanged)
	}
	return s
}

// TestPredicatesOnlyFilter: every predicate of the Students' watch gives
// the same answer twice for the same event and changes nothing: what the
// bridge does when a change arrives is the handler's (controller-runtime's
// rule; a predicate with a side effect acts on events a later predicate
// drops, and its order matters).
func TestPredicatesOnlyFilter(t *testing.T) {
	r := loadedReconciler(t)
	mine, theirs := watched("mine", 1, nil, studentv1.Finalizer), watched("theirs", 1, nil)
	changed := watched("mine", 2, map[string]string{"grade": "3"})
	deleting := watched("mine", 2, nil, studentv1.Finalizer)
	deleting.DeletionTimestamp = &metav1.Time{}
	type verdicts struct{ create, update, del, generic bool }
	before := r.state()
	for i, p := range r.predicates() {
		for _, pair := range [][2]*studentv1.Student{{mine, changed}, {mine, mine}, {theirs, theirs}, {mine, deleting}, {changed, mine}} {
			old, obj := pair[0], pair[1]
			ask := func() verdicts {
				return verdicts{
					create:  p.Create(event.CreateEvent{Object: obj, IsInInitialList: true}) && p.Create(event.CreateEvent{Object: obj}),
					update:  p.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: obj}),
					del:     p.Delete(event.DeleteEvent{Object: obj}),
					generic: p.Generic(event.GenericEvent{Object: obj}),
				}
			}
			first, second := ask(), ask()
			if first != second {
				t.Errorf("predicate %d answered %+v, then %+v for the same events of %s", i, first, second, obj.Namespace)
			}
			if after := r.state(); after != before {
				t.Fatalf("predicate %d changed the reconciler's state: %s, was %s", i, after, before)
			}
		}
	}
}

// TestWatchHandler: the handler queues what passes, stamps it, keeps a
// deleted Student's last state, and of the initial list queues only what
// needs a reconcile (asking for the status view of the rest) and counts it
// as a catch-up.
func TestWatchHandler(t *testing.T) {
	ctx := context.Background()
	r := loadedReconciler(t)
	h := r.watchHandler()
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	key := types.NamespacedName{Namespace: "mine", Name: "wang"}

	h.Create(ctx, event.CreateEvent{Object: watched("mine", 1, nil, studentv1.Finalizer), IsInInitialList: true}, q)
	if _, unchanged := r.status.Waiting(); q.Len() != 0 || r.catchUps.Pending() != 0 || unchanged != 1 {
		t.Fatalf("an unchanged Student of the initial list: queued %d, catch-up %d, status asked %d; want 0, 0, 1", q.Len(), r.catchUps.Pending(), unchanged)
	}
	if _, ok := r.seen.Load(key); ok {
		t.Fatal("an unchanged Student of the initial list was stamped as waiting")
	}

	h.Create(ctx, event.CreateEvent{Object: watched("mine", 1, nil), IsInInitialList: true}, q)
	if q.Len() != 1 || r.catchUps.Pending() != 1 {
		t.Fatalf("a Student of the initial list without its finalizer: queued %d, catch-up %d; want 1, 1", q.Len(), r.catchUps.Pending())
	}
	if _, ok := r.seen.Load(key); !ok {
		t.Fatal("a queued Student was not stamped")
	}

	gone := watched("mine", 3, map[string]string{"last": "state"})
	h.Delete(ctx, event.DeleteEvent{Object: gone}, q)
	if v, ok := r.gone.Load(key); !ok || v.(goneState) != (goneState{s: gone, final: true}) {
		t.Fatalf("the deleted Student's final state was not kept: %v", v)
	}
	// A deletion a relist found: the state kept is the cache's, not final.
	h.Delete(ctx, event.DeleteEvent{Object: gone, DeleteStateUnknown: true}, q)
	if v, ok := r.gone.Load(key); !ok || v.(goneState) != (goneState{s: gone, final: false}) {
		t.Fatalf("a tombstone's state was kept as final: %v", v)
	}
	if q.Len() != 1 {
		t.Fatalf("queued %d, want the one key once", q.Len())
	}
}
