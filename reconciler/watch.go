package reconciler

import (
	"context"
	"time"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// watchHandler queues what the Students' watch shows (past its
// predicates), as controller-runtime's EnqueueRequestForObject does, with
// the live changes ahead of the initial list. Around that it does what the
// bridge must the moment a change arrives:
//
//   - a deleted Student's last state is kept: without a finalizer it is the
//     final state its deleted event carries;
//   - a Student of the initial list that needs no reconcile (its state is
//     what was last published and, when the bridge holds deletes, it carries
//     the finalizer) is not queued: only its status view is asked for,
//     behind what is asked for since (EnqueueUnchanged), so a restart
//     reconciles what changed meanwhile, not every Student. Until the
//     records are loaded it cannot tell: the list waits for them once, at
//     most initialListWait (nothing is published before they are loaded
//     anyway), and is queued as it comes if they take longer;
//   - the rest of the initial list counts as a catch-up (the bridge was
//     away from those Students);
//   - what is queued is stamped with when the watch showed it: where the
//     queue stage begins.
type watchHandler struct {
	r       *StudentReconciler
	enqueue handler.EnqueueRequestForObject
}

func (r *StudentReconciler) watchHandler() handler.EventHandler {
	return watchHandler{r: r}
}

func (h watchHandler) Create(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	key := client.ObjectKeyFromObject(e.Object)
	if e.IsInInitialList {
		if s, ok := e.Object.(*studentv1.Student); ok && h.r.recordsForInitialList() && !h.r.needsReconcile(s) {
			h.r.status.EnqueueUnchanged(key)
			return
		}
		h.r.catchUps.add(key)
	}
	h.r.stamp(key)
	h.enqueue.Create(ctx, e, q)
}

func (h watchHandler) Update(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	h.r.stamp(client.ObjectKeyFromObject(e.ObjectNew))
	h.enqueue.Update(ctx, e, q)
}

func (h watchHandler) Delete(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	key := client.ObjectKeyFromObject(e.Object)
	if s, ok := e.Object.(*studentv1.Student); ok {
		h.r.gone.Store(key, goneState{s: s, final: !e.DeleteStateUnknown})
	}
	h.r.stamp(key)
	h.enqueue.Delete(ctx, e, q)
}

func (h watchHandler) Generic(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	h.r.stamp(client.ObjectKeyFromObject(e.Object))
	h.enqueue.Generic(ctx, e, q)
}

// stamp remembers when the watch showed a change of a Student whose
// reconcile has not started yet.
func (r *StudentReconciler) stamp(key client.ObjectKey) {
	r.seen.LoadOrStore(key, time.Now())
}
