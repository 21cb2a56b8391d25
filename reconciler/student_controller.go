// Package reconciler turns Student changes into CloudEvents and Kubernetes
// Events. It depends on the sink.Sink interface, never on a broker.
package reconciler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/sink"
)

// ControllerName names the controller, its Kubernetes Events' reporter and
// its leader-election lock.
const ControllerName = "student-bridge"

// StudentReconciler publishes every change of a Student to a Sink and records
// it as a Kubernetes Event and in the Student's status.
type StudentReconciler struct {
	// Client reads Students from the cache and writes finalizers and status.
	Client client.Client
	// APIReader reads Students from the API server when the cache is behind
	// (a conflict on a finalizer write); Client when nil.
	APIReader client.Reader
	// Sink receives the CloudEvents.
	Sink sink.Sink
	// Recorder records Kubernetes Events on Students.
	Recorder events.EventRecorder
	// Cluster names the cluster in the CloudEvent source.
	Cluster string
	// Now returns the current time; time.Now when nil.
	Now func() time.Time
	// Timeout bounds one reconcile. A reconcile is not cancelled when the
	// bridge shuts down, so a publish that reached the broker also gets its
	// status written; Timeout keeps shutdown bounded. Default 1m.
	Timeout time.Duration

	// published remembers what this process published and the broker
	// acknowledged, until the cache shows the status write. Without it a
	// reconcile that reads a stale cache, or follows a failed status write,
	// would publish the same change again (the stream would drop the copy,
	// but core NATS subscribers would see it twice).
	published sync.Map // types.NamespacedName -> studentv1.PublishedEvent

	inFlight atomic.Int32 // reconciles running now
}

// InFlight is how many reconciles are running now. When it reaches the
// number of workers, changes are waiting: the bridge has a backlog.
func (r *StudentReconciler) InFlight() int { return int(r.inFlight.Load()) }

// +kubebuilder:rbac:groups=example.k8s.io,resources=students,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=example.k8s.io,resources=students/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=example.k8s.io,resources=students/finalizers,verbs=update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile publishes the change the Student's current state needs, if any.
func (r *StudentReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()

	var stu studentv1.Student
	if err := r.Client.Get(ctx, req.NamespacedName, &stu); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, r.reconcileVanished(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, err
	}

	if !stu.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.reconcileDelete(ctx, &stu)
	}

	if !controllerutil.ContainsFinalizer(&stu, studentv1.Finalizer) {
		if err := r.patchFinalizers(ctx, &stu, func(s *studentv1.Student) bool { return controllerutil.AddFinalizer(s, studentv1.Finalizer) }); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer: %w", err)
		}
		if !stu.DeletionTimestamp.IsZero() {
			return ctrl.Result{}, r.reconcileDelete(ctx, &stu)
		}
	}
	return ctrl.Result{}, r.reconcileNormal(ctx, &stu)
}

func (r *StudentReconciler) reconcileNormal(ctx context.Context, stu *studentv1.Student) error {
	orig := stu.DeepCopy()
	last := r.lastPublished(stu)

	var pubErr error
	if typ := NextChange(stu, last); typ != "" {
		last, pubErr = r.publish(ctx, stu, typ, last)
	}

	stu.Status.ObservedGeneration = stu.Generation
	stu.Status.LastPublished = last
	meta.SetStatusCondition(&stu.Status.Conditions, publishedCondition(stu, last, pubErr))

	if !equality.Semantic.DeepEqual(orig.Status, stu.Status) {
		if err := r.Client.Status().Patch(ctx, stu, client.MergeFrom(orig)); err != nil {
			return errors.Join(pubErr, fmt.Errorf("write status: %w", err))
		}
	}
	return pubErr
}

func (r *StudentReconciler) reconcileDelete(ctx context.Context, stu *studentv1.Student) error {
	if !controllerutil.ContainsFinalizer(stu, studentv1.Finalizer) {
		return nil
	}
	last := r.lastPublished(stu)
	if typ := NextChange(stu, last); typ != "" {
		if _, err := r.publish(ctx, stu, typ, last); err != nil {
			// The object is going away: its status is only worth writing so
			// that someone looking at the stuck Student sees why.
			orig := stu.DeepCopy()
			meta.SetStatusCondition(&stu.Status.Conditions, publishedCondition(stu, last, err))
			if !equality.Semantic.DeepEqual(orig.Status, stu.Status) {
				if serr := r.Client.Status().Patch(ctx, stu, client.MergeFrom(orig)); serr != nil && !apierrors.IsNotFound(serr) {
					err = errors.Join(err, fmt.Errorf("write status: %w", serr))
				}
			}
			return err
		}
	}

	err := r.patchFinalizers(ctx, stu, func(s *studentv1.Student) bool { return controllerutil.RemoveFinalizer(s, studentv1.Finalizer) })
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer: %w", err)
	}
	r.published.Delete(client.ObjectKeyFromObject(stu))
	return nil
}

// patchFinalizers applies change to stu's finalizers with a merge patch that
// is conditional on stu's resourceVersion, so it never drops a finalizer
// someone else added. When the cache was behind (a conflict), it reads the
// Student from the API server and tries again at once rather than waiting
// for the backoff: under a stream of user edits the cache is often behind.
func (r *StudentReconciler) patchFinalizers(ctx context.Context, stu *studentv1.Student, change func(*studentv1.Student) bool) error {
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	var err error
	for range 5 {
		orig := stu.DeepCopy()
		if !change(stu) {
			return nil
		}
		err = r.Client.Patch(ctx, stu, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
		if !apierrors.IsConflict(err) {
			return err
		}
		if err := reader.Get(ctx, client.ObjectKeyFromObject(stu), stu); err != nil {
			return err
		}
	}
	return err
}

// reconcileVanished handles a Student that is gone. Normally its finalizer
// made sure the deleted event went out first. But kube-apiserver can let a
// delete that races with the finalizer being added remove the object anyway
// (kubernetes/kubernetes#77988): if this process published the Student and
// never its deletion, it publishes the deleted event now, from what it last
// published.
func (r *StudentReconciler) reconcileVanished(ctx context.Context, key types.NamespacedName) error {
	v, ok := r.published.Load(key)
	if !ok {
		return nil
	}
	e := v.(publishedEntry)
	if e.event.Type != studentv1.EventTypeDeleted {
		gone := &studentv1.Student{
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, UID: e.uid, Generation: e.event.Generation, Labels: e.event.Labels},
			Spec:       e.event.Spec,
		}
		ev, err := NewEvent(r.Cluster, studentv1.EventTypeDeleted, EventID(studentv1.EventTypeDeleted, gone, ""), gone, &e.event, r.now())
		if err != nil {
			return reconcile.TerminalError(err)
		}
		if _, err := send(ctx, r.Sink, ev); err != nil {
			return fmt.Errorf("publish %s %s of vanished %s: %w", studentv1.EventTypeDeleted, ev.ID(), key, err)
		}
		log.FromContext(ctx).Info("Student vanished without its finalizer; published its deletion", "id", ev.ID())
	}
	r.published.Delete(key)
	return nil
}

// publish sends the event of type typ for stu and, once the broker
// acknowledged it, remembers and returns the new last-published record. On
// failure it returns last unchanged and the error.
func (r *StudentReconciler) publish(ctx context.Context, stu *studentv1.Student, typ string, last *studentv1.PublishedEvent) (*studentv1.PublishedEvent, error) {
	previousID := ""
	if last != nil {
		previousID = last.ID
	}
	now := r.now()
	ev, err := NewEvent(r.Cluster, typ, EventID(typ, stu, previousID), stu, last, now)
	if err != nil {
		r.Recorder.Eventf(stu, nil, corev1.EventTypeWarning, studentv1.ReasonInvalid, "Publish", "cannot build %s event: %v", typ, err)
		return last, reconcile.TerminalError(err)
	}

	receipt, err := send(ctx, r.Sink, ev)
	if err != nil {
		reason := studentv1.ReasonPublishFailed
		if errors.Is(err, sink.ErrTooLarge) {
			// The same event will never fit: wait for the Student to change
			// instead of retrying.
			reason = studentv1.ReasonInvalid
			err = reconcile.TerminalError(err)
		}
		r.Recorder.Eventf(stu, nil, corev1.EventTypeWarning, reason, "Publish", "publishing %s (id %s) failed: %v", typ, ev.ID(), err)
		return last, fmt.Errorf("publish %s %s: %w", typ, ev.ID(), err)
	}

	log.FromContext(ctx).V(1).Info("published", "type", typ, "id", ev.ID(), "subject", receipt.Subject, "sequence", receipt.Sequence, "duplicate", receipt.Duplicate)

	rec := &studentv1.PublishedEvent{
		Type:       typ,
		ID:         ev.ID(),
		Time:       metav1.NewTime(now.Truncate(time.Second)),
		Generation: stu.Generation,
		Sequence:   int64(receipt.Sequence),
		Spec:       stu.Spec,
		Labels:     stu.Labels,
	}
	r.published.Store(client.ObjectKeyFromObject(stu), publishedEntry{uid: stu.UID, event: *rec})
	r.Recorder.Eventf(stu, nil, corev1.EventTypeNormal, studentv1.ReasonPublished, "Publish", "published %s to %s, id %s, stream sequence %d", typ, receipt.Subject, ev.ID(), receipt.Sequence)
	return rec, nil
}

type publishedEntry struct {
	uid   types.UID
	event studentv1.PublishedEvent
}

// lastPublished is what this process remembers publishing for stu, or else
// what stu's status says.
func (r *StudentReconciler) lastPublished(stu *studentv1.Student) *studentv1.PublishedEvent {
	key := client.ObjectKeyFromObject(stu)
	if v, ok := r.published.Load(key); ok {
		e := v.(publishedEntry)
		switch {
		case e.uid != stu.UID:
			r.published.Delete(key)
		case stu.Status.LastPublished != nil && stu.Status.LastPublished.ID == e.event.ID:
			// The cache has caught up with the status write: the entry has
			// done its job, and memory stays bounded by what is in flight.
			r.published.Delete(key)
		default:
			ev := e.event
			return &ev
		}
	}
	return stu.Status.LastPublished.DeepCopy()
}

func publishedCondition(stu *studentv1.Student, last *studentv1.PublishedEvent, pubErr error) metav1.Condition {
	c := metav1.Condition{
		Type:               studentv1.ConditionPublished,
		ObservedGeneration: stu.Generation,
	}
	switch {
	case pubErr != nil:
		c.Status = metav1.ConditionFalse
		c.Reason = studentv1.ReasonPublishFailed
		if errors.Is(pubErr, sink.ErrTooLarge) {
			c.Reason = studentv1.ReasonInvalid
		}
		c.Message = pubErr.Error()
	case last != nil:
		c.Status = metav1.ConditionTrue
		c.Reason = studentv1.ReasonPublished
		c.Message = fmt.Sprintf("%s %s published as stream sequence %d", last.Type, last.ID, last.Sequence)
	default:
		c.Status = metav1.ConditionUnknown
		c.Reason = "Pending"
		c.Message = "not published yet"
	}
	return c
}

func (r *StudentReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// SetupWithManager registers the reconciler with mgr.
func (r *StudentReconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&studentv1.Student{}, builder.WithPredicates(changePredicate())).
		WithOptions(opts).
		Complete(r)
}

// changePredicate lets through the updates that can need an event or a
// finalizer: spec (generation), labels, deletion and finalizers, and the
// bridge's own status write of a new publish (its reconcile writes nothing
// and lets go of the in-memory record). Other status updates and annotation
// updates are dropped before they reach the queue.
func changePredicate() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld, e.ObjectNew
			return o.GetGeneration() != n.GetGeneration() ||
				!equality.Semantic.DeepEqual(o.GetLabels(), n.GetLabels()) ||
				!equality.Semantic.DeepEqual(o.GetDeletionTimestamp(), n.GetDeletionTimestamp()) ||
				!equality.Semantic.DeepEqual(o.GetFinalizers(), n.GetFinalizers()) ||
				publishedID(o) != publishedID(n)
		},
	}
}

func publishedID(o client.Object) string {
	if s, ok := o.(*studentv1.Student); ok && s.Status.LastPublished != nil {
		return s.Status.LastPublished.ID
	}
	return ""
}
