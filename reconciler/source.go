package reconciler

import (
	"context"
	"fmt"
	"time"

	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// informerRetry is how long a watch that cannot get the Students'
// informer (the CRD not installed yet) waits before it asks again.
const informerRetry = time.Second

// WaitForStudents waits until the cache's Students informer has synced,
// and reports false if ctx ended first. It waits on the informer's sync
// without polling: the cache's WaitForCacheSync looks every 100 ms, and a
// start used to wait for such looks several times in turn (the records'
// catch-up, the controller's watch, the receipts), a fixed part of every
// start and failover whatever the count of Students.
func WaitForStudents(ctx context.Context, c cache.Informers) bool {
	inf, err := studentInformer(ctx, c)
	return err == nil && toolscache.WaitFor(ctx, "", inf.HasSyncedChecker())
}

// studentInformer is c's informer of Students, not waiting for it to sync.
// It asks again every informerRetry until ctx ends.
func studentInformer(ctx context.Context, c cache.Informers) (cache.Informer, error) {
	for {
		inf, err := c.GetInformer(ctx, &studentv1.Student{}, cache.BlockUntilSynced(false))
		if err == nil {
			return inf, nil
		}
		log.FromContext(ctx).Error(err, "cannot watch Students yet; trying again", "in", informerRetry.String())
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("watch Students: %w", err)
		case <-time.After(informerRetry):
		}
	}
}

// studentWatch is the controller's source of the Students' watch: what
// controller-runtime's source.Kind does (the handler behind the
// predicates), except that WaitForSync, which the controller's workers
// wait for, waits on the handler's sync without polling. source.Kind
// polls the cache's sync and then the handler's every 100 ms each, in
// turn: up to 200 ms before the workers start, at any count of Students.
// It also hands each event to the handler without a context of its own.
type studentWatch struct {
	cache      cache.Informers
	handler    handler.EventHandler
	predicates []predicate.Predicate

	started chan struct{} // closed once reg or err is set
	reg     toolscache.ResourceEventHandlerRegistration
	err     error
}

var _ source.SyncingSource = (*studentWatch)(nil)

func newStudentWatch(c cache.Informers, h handler.EventHandler, predicates ...predicate.Predicate) *studentWatch {
	return &studentWatch{cache: c, handler: h, predicates: predicates, started: make(chan struct{})}
}

// Start adds the handler to the Students' informer, once the cache has
// one: it returns at once, WaitForSync waits.
func (w *studentWatch) Start(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
	go func() {
		defer close(w.started)
		inf, err := studentInformer(ctx, w.cache)
		if err != nil {
			w.err = err
			return
		}
		w.reg, w.err = inf.AddEventHandlerWithOptions(watchEvents{ctx: ctx, q: q, h: w.handler, predicates: w.predicates}, toolscache.HandlerOptions{})
	}()
	return nil
}

// WaitForSync returns once the handler has been given the initial list.
func (w *studentWatch) WaitForSync(ctx context.Context) error {
	select {
	case <-w.started:
	case <-ctx.Done():
		return fmt.Errorf("the Students' watch did not start: %w", context.Cause(ctx))
	}
	if w.err != nil {
		return w.err
	}
	if !toolscache.WaitFor(ctx, "", w.reg.HasSyncedChecker()) {
		return fmt.Errorf("the Students' watch did not sync: %w", context.Cause(ctx))
	}
	return nil
}

func (w *studentWatch) String() string { return "Students' watch" }

// watchEvents hands the informer's events to a handler, as typed events
// past the predicates.
type watchEvents struct {
	ctx        context.Context
	q          workqueue.TypedRateLimitingInterface[reconcile.Request]
	h          handler.EventHandler
	predicates []predicate.Predicate
}

func (w watchEvents) OnAdd(obj any, initial bool) {
	o, ok := obj.(client.Object)
	if !ok {
		return
	}
	e := event.CreateEvent{Object: o, IsInInitialList: initial}
	for _, p := range w.predicates {
		if !p.Create(e) {
			return
		}
	}
	w.h.Create(w.ctx, e, w.q)
}

func (w watchEvents) OnUpdate(oldObj, newObj any) {
	o, ok1 := oldObj.(client.Object)
	n, ok2 := newObj.(client.Object)
	if !ok1 || !ok2 {
		return
	}
	e := event.UpdateEvent{ObjectOld: o, ObjectNew: n}
	for _, p := range w.predicates {
		if !p.Update(e) {
			return
		}
	}
	w.h.Update(w.ctx, e, w.q)
}

func (w watchEvents) OnDelete(obj any) {
	e := event.DeleteEvent{}
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		// The watch missed the delete: the object is the last state
		// the cache had.
		obj, e.DeleteStateUnknown = t.Obj, true
	}
	o, ok := obj.(client.Object)
	if !ok {
		return
	}
	e.Object = o
	for _, p := range w.predicates {
		if !p.Delete(e) {
			return
		}
	}
	w.h.Delete(w.ctx, e, w.q)
}
