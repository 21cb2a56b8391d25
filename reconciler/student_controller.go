// Package reconciler turns Student changes into CloudEvents and Kubernetes
// Events. It depends on the sink interfaces only, never on a broker: what is
// published goes to a sink.Sink, what was published is remembered in a
// sink.Store (Records).
//
// It is the bridge's implementation, not part of the module's public API
// (api/v1, api/contract and consumer): it may change in any release.
package reconciler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/queue"
	"github.com/student-bridge/student-bridge/internal/records"
	"github.com/student-bridge/student-bridge/internal/stages"
	"github.com/student-bridge/student-bridge/internal/statusview"
	"github.com/student-bridge/student-bridge/sink"
)

// ControllerName names the controller, its Kubernetes Events' reporter and
// its leader-election lock.
const ControllerName = "student-bridge"

// errTerminal is what errors.Is tells a terminal error by: made once, as
// reconcile.TerminalError(nil) allocates.
var errTerminal = reconcile.TerminalError(nil)

// Deps are what a StudentReconciler cannot work without.
type Deps struct {
	// Client reads Students from the cache and writes finalizers.
	Client client.Client
	// APIReader reads Students from the API server when the cache cannot
	// answer: a conflict on a finalizer write, a Student that left the
	// watched scope. Default: Client.
	APIReader client.Reader
	// Sink receives the CloudEvents.
	Sink sink.Sink
	// Records is what was published; reconciles wait until it is loaded.
	Records *records.Set
}

// Options are what a StudentReconciler may be given. Each is optional: its
// zero value is the default New says.
type Options struct {
	// Cluster names the cluster in the CloudEvent source.
	Cluster string
	// HoldWithFinalizer keeps a deleted Student until its deleted event is
	// acknowledged (the exact final state). Without it the bridge writes
	// nothing to Students, and a delete carries the watch's final state (or
	// the last published state, for a delete that happened while the bridge
	// was down).
	HoldWithFinalizer bool
	// Recorder records Kubernetes Events on Students. Default: none are
	// recorded.
	Recorder events.EventRecorder
	// Status writes the status view. Default: none is written (a nil
	// *statusview.Writer writes nothing).
	Status *statusview.Writer
	// Receipts is what services reported. Default: receipts are off (a nil
	// *statusview.Receipts has none).
	Receipts *statusview.Receipts
	// Shards says which Students this replica publishes for
	// (active-active replicas). Default: every Student, and no check
	// that only a sharded bridge needs (staleFirst).
	Shards ShardOwner
	// InScope says whether a Student is in the watched scope (its namespace
	// is watched and the label selector matches it; Scope makes it).
	// Default: every Student is. A Student the cache does not have, but
	// the API server does, left the scope only if it is out of it:
	// otherwise the cache is behind (it relists after a watch that
	// expired, or starts late on a gained shard).
	InScope func(*studentv1.Student) bool
	// LabelScoped says the watch has a label selector. A Student whose
	// labels leave it then looks deleted to the watch, with its last state
	// in scope, so every Student the watch shows deleted is looked up on
	// the API server before its deletion is published. Without a selector
	// (the namespaces are fixed while the bridge runs) a deletion the watch
	// showed with the final state is one, and is published without that
	// read.
	LabelScoped bool
	// Namespaces are the namespaces the cache watches; empty: all.
	Namespaces []string
	// Now returns the current time. Default: time.Now.
	Now func() time.Time
	// Timeout bounds one reconcile. A reconcile is not cancelled when the
	// bridge shuts down, so a publish that reached the broker also gets its
	// record written; Timeout keeps shutdown bounded. Default: 1m.
	Timeout time.Duration
}

// StudentReconciler publishes every change of a Student to a Sink, remembers
// it in Records and records it as a Kubernetes Event. It never reads the
// Student's status to decide anything. New makes one; nothing of it changes
// after that.
type StudentReconciler struct {
	client            client.Client
	apiReader         client.Reader
	sink              sink.Sink
	records           *records.Set
	cluster           string
	holdWithFinalizer bool
	recorder          events.EventRecorder
	status            *statusview.Writer
	receipts          *statusview.Receipts
	shards            ShardOwner
	sharded           bool // Options.Shards was given
	inScope           func(*studentv1.Student) bool
	labelScoped       bool
	namespaces        []string
	now               func() time.Time
	timeout           time.Duration

	// gone holds the last state the watch showed of deleted Students, for
	// their deleted event when no finalizer held them.
	gone sync.Map // types.NamespacedName -> goneState
	// failures holds the last publish failure per Student, for the status.
	failures sync.Map // types.NamespacedName -> error
	// brokerWaits holds the Students whose last attempt failed because the
	// broker could not take it, until they are queued again (succeeded);
	// brokerWaiting counts them.
	brokerWaits   sync.Map // types.NamespacedName -> struct{}
	brokerWaiting atomic.Int64
	// refused holds, per Student, the id of the event a terminal error
	// refused (it will never fit), until the Student publishes again.
	refused sync.Map // types.NamespacedName -> string
	// seen holds when the watch first showed a change of a Student that
	// no reconcile has started for yet: the queue stage's start.
	seen sync.Map // types.NamespacedName -> time.Time
	// toQueue hands what a catch-up found (CatchUp, EnqueueShard) to the
	// controller, as the watch hands it changes.
	toQueue chan event.TypedGenericEvent[*studentv1.Student]
	// catchUps tracks what catch-ups queued until it is reconciled.
	catchUps catchUpTracker
	// listWait is the initial list's one wait for the records (watchHandler).
	listWait sync.Once

	inFlight atomic.Int32 // reconciles running now
}

// New makes the Student reconciler from its dependencies and options, with
// the defaults Options names for what they leave out.
func New(d Deps, o Options) (*StudentReconciler, error) {
	switch {
	case d.Client == nil:
		return nil, errors.New("reconciler: Deps.Client is required")
	case d.Sink == nil:
		return nil, errors.New("reconciler: Deps.Sink is required")
	case d.Records == nil:
		return nil, errors.New("reconciler: Deps.Records is required")
	}
	r := &StudentReconciler{
		client: d.Client, apiReader: d.APIReader, sink: d.Sink, records: d.Records,
		cluster: o.Cluster, holdWithFinalizer: o.HoldWithFinalizer, recorder: o.Recorder,
		status: o.Status, receipts: o.Receipts, shards: o.Shards, sharded: o.Shards != nil,
		inScope: o.InScope, labelScoped: o.LabelScoped, namespaces: o.Namespaces, now: o.Now, timeout: o.Timeout,
		toQueue: make(chan event.TypedGenericEvent[*studentv1.Student], toQueueSize),
	}
	if r.apiReader == nil {
		r.apiReader = d.Client
	}
	if r.recorder == nil {
		r.recorder = noEvents{}
	}
	if r.shards == nil {
		r.shards = everyShard{}
	}
	if r.inScope == nil {
		r.inScope = func(*studentv1.Student) bool { return true }
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.timeout <= 0 {
		r.timeout = time.Minute
	}
	return r, nil
}

// noEvents is the recorder of a bridge that records no Kubernetes Events.
type noEvents struct{}

func (noEvents) Eventf(_, _ runtime.Object, _, _, _, _ string, _ ...any) {}

// everyShard is the shard owner of a single bridge: every Student is its.
type everyShard struct{}

func (everyShard) Owns(types.NamespacedName) bool            { return true }
func (everyShard) Begin(types.NamespacedName) (func(), bool) { return func() {}, true }
func (everyShard) Lost(types.NamespacedName)                 {}

// InFlight is how many reconciles are running now. When it reaches the
// number of workers, changes are waiting: the bridge has a backlog.
func (r *StudentReconciler) InFlight() int { return int(r.inFlight.Load()) }

// +kubebuilder:rbac:groups=example.k8s.io,resources=students,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=example.k8s.io,resources=students/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=example.k8s.io,resources=students/finalizers,verbs=update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile publishes the change the Student's current state needs, if any.
func (r *StudentReconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, err error) {
	if t, ok := r.seen.LoadAndDelete(req.NamespacedName); ok {
		since(stages.Queue, t.(time.Time))
	}
	defer func() {
		// Done with, for a catch-up: reconciled, or it cannot be until
		// the Student changes (a terminal error).
		if (err == nil && result.IsZero()) || errors.Is(err, errTerminal) {
			r.catchUps.done(req.NamespacedName)
		}
	}()
	done, ok := r.shards.Begin(req.NamespacedName)
	if !ok {
		return ctrl.Result{}, nil // another replica's; queued again when its shard comes here
	}
	defer done()
	defer func() {
		// Another replica wrote this Student's record: it holds the
		// shard now, and this replica must stop publishing for it.
		if errors.Is(err, sink.ErrConflict) {
			r.shards.Lost(req.NamespacedName)
		}
	}()
	r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout)
	defer cancel()
	if err := r.records.Wait(ctx); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.publishReserved(ctx, req.NamespacedName); err != nil {
		return ctrl.Result{}, err
	}

	var stu studentv1.Student
	if err := r.client.Get(ctx, req.NamespacedName, &stu); err != nil {
		if apierrors.IsNotFound(err) {
			return r.reconcileGone(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, err
	}
	// A Student deleted and created again under the same name while the
	// bridge was away: the old one's deletion comes first.
	if err := r.reconcileReplaced(ctx, &stu); err != nil {
		return ctrl.Result{}, err
	}

	if !stu.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.reconcileDelete(ctx, &stu)
	}
	if r.holdWithFinalizer && !controllerutil.ContainsFinalizer(&stu, studentv1.Finalizer) {
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
	rec, known := r.records.Get(stu.UID)
	last := lastPublished(rec, known)
	if !known {
		if behind, err := r.staleFirst(ctx, stu); err != nil || behind {
			return err
		}
	}
	if typ := contract.NextChange(stu, last); typ != "" {
		if err := r.publish(ctx, stu, typ, last); err != nil {
			return err
		}
	} else if r.records.Unsaved() > 0 {
		// Nothing new, but records wait for the store: until it takes
		// them a restart would publish them again, so keep retrying.
		if err := r.records.Flush(ctx); err != nil {
			return r.failed(client.ObjectKeyFromObject(stu), fmt.Errorf("the record store holds back %d record(s): %w", r.records.Unsaved(), err))
		}
	}
	r.status.Enqueue(client.ObjectKeyFromObject(stu))
	return nil
}

func (r *StudentReconciler) reconcileDelete(ctx context.Context, stu *studentv1.Student) error {
	if !controllerutil.ContainsFinalizer(stu, studentv1.Finalizer) {
		// Not held: its deletion is published when it is gone.
		return nil
	}
	if last := lastPublished(r.records.Get(stu.UID)); last == nil || last.Type != studentv1.EventTypeDeleted {
		if err := r.publish(ctx, stu, studentv1.EventTypeDeleted, last); err != nil {
			return err
		}
	}
	err := r.patchFinalizers(ctx, stu, func(s *studentv1.Student) bool { return controllerutil.RemoveFinalizer(s, studentv1.Finalizer) })
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer: %w", err)
	}
	r.succeeded(client.ObjectKeyFromObject(stu))
	// The record says "deleted" until here, so a retry of the finalizer
	// removal publishes nothing again. Should this delete fail, the next
	// catch-up finds a deleted record without its Student and removes it.
	return r.removeRecord(ctx, stu.UID)
}

// reconcileGone handles the records of a name the cache has no Student
// for: deleted without a finalizer (while the bridge ran or while it was
// down), lost to kube-apiserver's delete/finalizer race
// (kubernetes/kubernetes#77988), or out of the watched scope (a label or a
// namespace the bridge no longer watches).
func (r *StudentReconciler) reconcileGone(ctx context.Context, key types.NamespacedName) (ctrl.Result, error) {
	recs := r.records.ForName(key, nil)
	if len(recs) == 0 {
		// Its record went with the delete (removeRecord), and its receipts
		// with it; but a service's receipt of the deleted event can come
		// after, while the Student was still there, finalizer and all.
		// Gone now, it has none.
		if g, ok := r.lastSeen(key); ok {
			if err := r.receipts.Forget(ctx, string(g.s.UID)); err != nil {
				return ctrl.Result{}, err
			}
		}
		r.gone.Delete(key)
		return ctrl.Result{}, nil
	}
	live, err := r.liveStudent(ctx, key, recs)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("look up %s: %w", key, err)
	}
	var errs []error
	for _, rec := range recs {
		exists := live != nil && live.UID == rec.UID
		switch {
		case exists && rec.Published.Type == studentv1.EventTypeDeleted:
			// Left the scope earlier; the record keeps the next created
			// apart from the first.
		case exists && r.inScope(live):
			// In scope, so the cache is behind: its watch event queues the
			// Student again; look again in a moment all the same.
			return ctrl.Result{RequeueAfter: time.Second}, nil
		case exists:
			errs = append(errs, r.leaveScope(ctx, live, rec))
		case rec.Published.Type == studentv1.EventTypeDeleted:
			errs = append(errs, r.removeRecord(ctx, rec.UID))
		default:
			errs = append(errs, r.publishGone(ctx, key, rec))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, err
	}
	r.gone.Delete(key)
	r.succeeded(key)
	return ctrl.Result{}, nil
}

// liveStudent is the Student named key on the API server, nil if there is
// none, for the records recs of that name the cache has no Student for.
// The read is saved when the watch showed the Student of every one of
// recs deleted, with its final state, and has no label selector: then it
// is gone (Options.LabelScoped).
func (r *StudentReconciler) liveStudent(ctx context.Context, key types.NamespacedName, recs []studentv1.StudentRecord) (*studentv1.Student, error) {
	if g, ok := r.lastSeen(key); ok && g.final && !r.labelScoped &&
		!slices.ContainsFunc(recs, func(rec studentv1.StudentRecord) bool { return rec.UID != g.s.UID }) {
		return nil, nil
	}
	var live studentv1.Student
	err := r.apiReader.Get(ctx, key, &live)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return &live, nil
}

// goneState is the last state the watch showed of a deleted Student, and
// whether it is the final one: not when the watch missed the deletion and
// a relist found the Student missing (a tombstone of the cache's state).
type goneState struct {
	s     *studentv1.Student
	final bool
}

// lastSeen is what the watch showed last of the deleted Student named key.
func (r *StudentReconciler) lastSeen(key types.NamespacedName) (goneState, bool) {
	v, ok := r.gone.Load(key)
	if !ok {
		return goneState{}, false
	}
	return v.(goneState), true
}

// staleFirst reports whether stu, which has no record here, is a state the
// API server has left behind, so that its first event must not go out.
// Among replicas, a replica that takes over a shard while its cache is
// behind may still show a Student that the previous holder published as
// deleted, and whose record it then removed: that state would go out as
// created again. The first event of a Student's first generation has the
// same id every time, so the stream drops such a copy as a duplicate; a
// later generation's is a new event, so it is checked against the API
// server first. A single bridge needs no check: its cache showed the
// Student deleted before its record was removed.
func (r *StudentReconciler) staleFirst(ctx context.Context, stu *studentv1.Student) (bool, error) {
	if !r.sharded || stu.Generation <= 1 {
		return false, nil
	}
	var live studentv1.Student
	err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(stu), &live)
	if apierrors.IsNotFound(err) {
		return true, nil // its watch event queues the name again
	}
	if err != nil {
		return false, fmt.Errorf("look up %s: %w", client.ObjectKeyFromObject(stu), err)
	}
	return live.UID != stu.UID || live.Generation != stu.Generation || !live.DeletionTimestamp.IsZero(), nil
}

// Scope returns the InScope of a bridge that watches namespaces (none:
// all) and the Students selector matches.
func Scope(namespaces []string, selector labels.Selector) func(*studentv1.Student) bool {
	return func(s *studentv1.Student) bool {
		return (len(namespaces) == 0 || slices.Contains(namespaces, s.Namespace)) && selector.Matches(labels.Set(s.Labels))
	}
}

// publishGone publishes the deletion of a Student that is gone: with the
// last state the watch showed of it if the bridge saw it go, else with the
// last state published.
func (r *StudentReconciler) publishGone(ctx context.Context, key types.NamespacedName, rec studentv1.StudentRecord) error {
	gone := recordedStudent(rec)
	if g, ok := r.lastSeen(key); ok && g.s.UID == rec.UID {
		gone = g.s
	}
	if err := r.publish(ctx, gone, studentv1.EventTypeDeleted, lastPublished(rec, true)); err != nil {
		return err
	}
	log.FromContext(ctx).Info("Student gone without its finalizer; published its deletion", "uid", rec.UID)
	return r.removeRecord(ctx, rec.UID)
}

// leaveScope publishes a Student that left the watched scope as deleted
// (for consumers it left the set) and lets go of it. Its record stays, as
// deleted, so that if it comes back it is created with a new id.
func (r *StudentReconciler) leaveScope(ctx context.Context, live *studentv1.Student, rec studentv1.StudentRecord) error {
	if err := r.publish(ctx, live, studentv1.EventTypeDeleted, lastPublished(rec, true)); err != nil {
		return err
	}
	err := r.patchFinalizers(ctx, live, func(s *studentv1.Student) bool { return controllerutil.RemoveFinalizer(s, studentv1.Finalizer) })
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer of %s, which left the watched scope: %w", client.ObjectKeyFromObject(live), err)
	}
	log.FromContext(ctx).Info("Student left the watched scope; published it as deleted", "uid", rec.UID)
	return nil
}

// reconcileReplaced publishes the deletion of every earlier Student with
// stu's name.
func (r *StudentReconciler) reconcileReplaced(ctx context.Context, stu *studentv1.Student) error {
	key := client.ObjectKeyFromObject(stu)
	others := func(rec *studentv1.StudentRecord) bool { return rec.UID != stu.UID }
	for _, rec := range r.records.ForName(key, others) {
		if rec.Published.Type == studentv1.EventTypeDeleted {
			if err := r.removeRecord(ctx, rec.UID); err != nil {
				return err
			}
			continue
		}
		if err := r.publishGone(ctx, key, rec); err != nil {
			return err
		}
	}
	return nil
}

// lastPublished is the event a record says was last published: nil without
// a record (ok false), while its first event is pending, and while an event
// is reserved (until publishReserved publishes it, nothing is known to be
// out, and the Student counts as one with a change to publish).
func lastPublished(rec studentv1.StudentRecord, ok bool) *studentv1.PublishedEvent {
	if !ok || rec.Pending || rec.Reserved() {
		return nil
	}
	return &rec.Published
}

// recordedStudent is the Student as its record last published it.
func recordedStudent(rec studentv1.StudentRecord) *studentv1.Student {
	p := rec.Published
	return &studentv1.Student{
		ObjectMeta: metav1.ObjectMeta{Namespace: rec.Namespace, Name: rec.Name, UID: rec.UID, Generation: p.Generation, Labels: p.Labels},
		Spec:       p.Spec,
	}
}

// patchFinalizers applies change to stu's finalizers (PatchFinalizers).
// When the cache was behind (a conflict), it reads the Student from the API
// server and tries again at once rather than waiting for the backoff: under
// a stream of user edits the cache is often behind.
func (r *StudentReconciler) patchFinalizers(ctx context.Context, stu *studentv1.Student, change func(*studentv1.Student) bool) error {
	defer since(stages.Finalizer, time.Now())
	return PatchFinalizers(ctx, r.client, r.apiReader, stu, finalizerAttempts, change)
}

// PatchFinalizers applies change to stu's finalizers with a merge patch
// that is conditional on stu's resourceVersion, so it never drops a
// finalizer someone else added. On a conflict it reads stu again from
// reader and retries, up to attempts times in all. change reports whether
// it changed anything; nothing to change patches nothing.
func PatchFinalizers(ctx context.Context, c client.Client, reader client.Reader, stu *studentv1.Student, attempts int, change func(*studentv1.Student) bool) error {
	var err error
	for range attempts {
		orig := stu.DeepCopy()
		if !change(stu) {
			return nil
		}
		err = c.Patch(ctx, stu, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
		if !apierrors.IsConflict(err) {
			return err
		}
		if err := reader.Get(ctx, client.ObjectKeyFromObject(stu), stu); err != nil {
			return err
		}
	}
	return err
}

// publishReserved publishes the reserved event of each record of key that
// is pending (see publish), as it was reserved, and records it as
// published. Whoever reserved it (this bridge before a failure or a
// restart, or the replica that held the Student's shard before, and may
// still be running) may have published it or not: published again with
// the same id it is in the stream once (the stream drops a copy within its
// duplicate window), and no other event takes its number.
func (r *StudentReconciler) publishReserved(ctx context.Context, key types.NamespacedName) error {
	for _, rec := range r.records.ForName(key, (*studentv1.StudentRecord).Reserved) {
		// The store must hold the reservation before its event goes out.
		if err := r.flush(ctx); err != nil {
			return r.failed(key, err)
		}
		var ev cloudevents.Event
		if err := json.Unmarshal(rec.Event, &ev); err != nil {
			return r.failed(key, reconcile.TerminalError(fmt.Errorf("the reserved event of %s (uid %s) cannot be read: %w", key, rec.UID, err)))
		}
		receipt, err := send(ctx, r.sink, ev, rec.Event)
		if err != nil {
			return r.failed(key, fmt.Errorf("publish reserved %s %s: %w", rec.Published.Type, ev.ID(), err))
		}
		log.FromContext(ctx).Info("published a reserved event", "type", ev.Type(), "id", ev.ID(), "uid", rec.UID,
			"sequence", receipt.Sequence, "duplicate", receipt.Duplicate)
		rec.Pending, rec.Event = false, nil
		rec.Published.Sequence = int64(receipt.Sequence)
		if err := r.save(ctx, stages.Record, rec); err != nil {
			return r.failed(key, fmt.Errorf("record reserved %s %s: %w", rec.Published.Type, ev.ID(), err))
		}
		r.succeeded(key)
		r.status.Enqueue(key)
	}
	return nil
}

// flush writes the records the store has held back (Records.Flush): until
// it took them, nothing new may be published.
func (r *StudentReconciler) flush(ctx context.Context) error {
	if err := r.records.Flush(ctx); err != nil {
		return fmt.Errorf("the record store holds back %d record(s); publishing nothing new: %w", r.records.Unsaved(), err)
	}
	return nil
}

// publish sends the event of type typ for stu and records it once the
// broker acknowledged it. last is what was published before (nil if
// nothing). Nothing is published while the record store holds back an
// earlier record (fail closed).
//
// The event is reserved first: its record, pending and carrying the
// event, is written with compare-and-set on the revision this bridge
// holds. A writer that lost the Student (a replica paused or cut off past
// its Lease, or one whose records are behind the store's) is refused
// there, before its event goes out; and a reservation whose event never
// got its ack is published as it is by whoever reads it next
// (publishReserved). So each of a Student's numbers goes to one event.
func (r *StudentReconciler) publish(ctx context.Context, stu *studentv1.Student, typ string, last *studentv1.PublishedEvent) (err error) {
	key := client.ObjectKeyFromObject(stu)
	previousID := ""
	if last != nil {
		previousID = last.ID
	}
	id := contract.EventID(typ, stu, previousID)
	if v, ok := r.refused.Load(key); ok && v.(string) == id {
		// Refused for good already: the same state queued twice (a
		// start's catch-up and its initial list) is not tried again,
		// it waits for the Student to change.
		return nil
	}
	ctx, span := startPublish(ctx, stu, typ)
	defer func() {
		endSpan(span, err)
		if errors.Is(err, errTerminal) {
			r.refused.Store(key, id)
		}
	}()
	now := r.now()
	ev, err := contract.NewEvent(r.cluster, typ, id, stu, last, now)
	if err != nil {
		r.recorder.Eventf(stu, nil, corev1.EventTypeWarning, studentv1.ReasonInvalid, "Publish", "cannot build %s event: %v", typ, err)
		return r.failed(key, reconcile.TerminalError(err))
	}
	seq := contract.Sequence(typ, last)
	stored, known := r.records.Get(stu.UID)
	if known && stored.Pending && !stored.Reserved() && stored.Published.ID != ev.ID() {
		// A first event reserved before v0.3.0, without the event: it
		// may be out already, so this one counts on from it, and no two
		// events share a number.
		seq, previousID = stored.Published.StudentSequence+1, stored.Published.ID
	}
	contract.Chain(&ev, seq, previousID)
	carryTrace(ctx, &ev)
	rec := studentv1.StudentRecord{
		Namespace: stu.Namespace,
		Name:      stu.Name,
		UID:       stu.UID,
		Published: studentv1.PublishedEvent{
			Type:            typ,
			ID:              ev.ID(),
			Time:            metav1.NewTime(now.Truncate(time.Second)),
			Generation:      stu.Generation,
			StudentSequence: seq,
			Spec:            stu.Spec,
			Labels:          stu.Labels,
		},
	}

	if err := r.flush(ctx); err != nil {
		r.warn(ctx, stu, err, "%v", err)
		return r.failed(key, err)
	}
	if c := r.records.Committer(); c != nil {
		return r.commit(ctx, c, stu, ev, rec)
	}
	// A first event's reservation is pending too, as before v0.3.0: a
	// replica of an earlier release, during a rolling upgrade, counts on
	// from it; a later event's looks published to such a replica.
	reserved := rec
	reserved.Pending = !known
	// The SDK's encoder, not json.Marshal, which would scan its output
	// once more to compact it: the record and the publish take it as is.
	if reserved.Event, err = ev.MarshalJSON(); err != nil {
		return r.failed(key, reconcile.TerminalError(fmt.Errorf("encode %s event %s: %w", typ, ev.ID(), err)))
	}
	if err := r.save(ctx, stages.WriteAhead, reserved); err != nil {
		err = fmt.Errorf("reserve %s %s before it goes out: %w", typ, ev.ID(), err)
		r.warn(ctx, stu, err, "%v", err)
		return r.failed(key, terminalIfInvalid(err))
	}

	sendCtx, sendSpan := startStep(ctx, "jetstream publish")
	receipt, err := send(sendCtx, r.sink, ev, reserved.Event)
	endSpan(sendSpan, err)
	if err != nil {
		r.warn(ctx, stu, err, "publishing %s (id %s) failed: %v", typ, ev.ID(), err)
		return r.failed(key, terminalIfInvalid(fmt.Errorf("publish %s %s: %w", typ, ev.ID(), err)))
	}
	if l := debug(ctx); l.Enabled() { // the arguments allocate even when the level is off
		l.Info("published", "type", typ, "id", ev.ID(), "subject", receipt.Subject, "sequence", receipt.Sequence, "duplicate", receipt.Duplicate)
	}
	r.recorder.Eventf(stu, nil, corev1.EventTypeNormal, studentv1.ReasonPublished, "Publish", "published %s to %s, id %s, stream sequence %d", typ, receipt.Subject, ev.ID(), receipt.Sequence)

	rec.Published.Sequence = int64(receipt.Sequence)
	recordCtx, recordSpan := startStep(ctx, "record")
	err = r.save(recordCtx, stages.Record, rec)
	endSpan(recordSpan, err)
	if err != nil {
		// The event is out: memory keeps the record, and nothing new goes
		// out until the store takes it.
		return r.failed(key, fmt.Errorf("record %s %s: %w", typ, ev.ID(), err))
	}
	r.succeeded(key)
	return nil
}

// commit sends ev with its record rec in one write (records in the
// events' stream): no write-ahead record is needed, and no moment exists
// at which the event is out and its record is not.
func (r *StudentReconciler) commit(ctx context.Context, c sink.Committer, stu *studentv1.Student, ev cloudevents.Event, rec studentv1.StudentRecord) error {
	key := client.ObjectKeyFromObject(stu)
	typ := rec.Published.Type
	sendCtx, sendSpan := startStep(ctx, "jetstream commit")
	receipt, err := measured(ev, func() (receipt sink.Receipt, err error) {
		err = r.records.Commit(sendCtx, rec, func(k string, value []byte, revision uint64) (uint64, uint64, error) {
			var rev uint64
			receipt, rev, err = c.Commit(sendCtx, ev, k, value, revision)
			return rev, receipt.Sequence, err
		})
		return receipt, err
	})
	endSpan(sendSpan, err)
	if err != nil {
		r.warn(ctx, stu, err, "publishing %s (id %s) failed: %v", typ, ev.ID(), err)
		return r.failed(key, terminalIfInvalid(fmt.Errorf("publish %s %s: %w", typ, ev.ID(), err)))
	}
	if l := debug(ctx); l.Enabled() {
		l.Info("published", "type", typ, "id", ev.ID(), "subject", receipt.Subject, "sequence", receipt.Sequence)
	}
	r.recorder.Eventf(stu, nil, corev1.EventTypeNormal, studentv1.ReasonPublished, "Publish", "published %s to %s, id %s, stream sequence %d", typ, receipt.Subject, ev.ID(), receipt.Sequence)
	r.succeeded(key)
	return nil
}

// warn records a Warning Event on stu for a publish (or its record) that
// failed with err. A cluster that cannot store for a moment (an election,
// a lost quorum: sink.ErrUnavailable) is no fault of the Student's or a
// refusal of the broker's: it is logged, counted and shown in the status,
// and retried, without a Warning Event. Records held back (also while
// another reconcile writes them: records.ErrFlushing) do get one: they
// say why nothing new is published, for as long as the store refuses.
func (r *StudentReconciler) warn(ctx context.Context, stu *studentv1.Student, err error, format string, args ...any) {
	if errors.Is(err, sink.ErrUnavailable) {
		log.FromContext(ctx).Info("NATS cannot store now; retrying", "reason", err.Error())
		return
	}
	r.recorder.Eventf(stu, nil, corev1.EventTypeWarning, statusview.FailureReason(err), "Publish", format, args...)
}

// save writes rec to the record store, timed as stage.
func (r *StudentReconciler) save(ctx context.Context, stage string, rec studentv1.StudentRecord) error {
	defer since(stage, time.Now())
	return r.records.Save(ctx, rec)
}

// failed remembers err for the status view and returns it. A failure of
// the broker's (not connected, or unavailable: no leader, no quorum, no
// answer) is also remembered for succeeded.
func (r *StudentReconciler) failed(key types.NamespacedName, err error) error {
	r.failures.Store(key, err)
	r.status.Enqueue(key)
	if waitsForBroker(err) {
		if _, loaded := r.brokerWaits.LoadOrStore(key, struct{}{}); !loaded {
			r.brokerWaiting.Add(1)
		}
	}
	return err
}

// waitsForBroker reports whether err is the broker's: not connected, or
// unavailable, or records held back by such a failure that another
// reconcile is writing now (records.ErrFlushing). A Student that failed so
// is queued again by the next success (succeeded), not left on a backoff
// that grew while the broker was away.
func waitsForBroker(err error) bool {
	return errors.Is(err, sink.ErrNotConnected) || errors.Is(err, sink.ErrUnavailable) || errors.Is(err, records.ErrFlushing)
}

// succeeded forgets key's failure. A success is news of the broker too:
// the Students whose last attempt the broker could not take wait on a
// backoff that doubled with each failure while it was away (retry), and
// would wait on after it is back, by as long as it was gone or longer.
// They are queued again now. A full queue channel leaves the rest to the
// next success.
func (r *StudentReconciler) succeeded(key types.NamespacedName) {
	r.failures.Delete(key)
	r.refused.Delete(key)
	r.stopWaiting(key)
	if r.brokerWaiting.Load() == 0 {
		return
	}
	r.brokerWaits.Range(func(k, _ any) bool {
		w := k.(types.NamespacedName)
		stu := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: w.Namespace, Name: w.Name}}
		select {
		case r.toQueue <- event.TypedGenericEvent[*studentv1.Student]{Object: stu}:
			r.stopWaiting(w)
			return true
		default:
			return false
		}
	})
}

func (r *StudentReconciler) stopWaiting(key types.NamespacedName) {
	if _, ok := r.brokerWaits.LoadAndDelete(key); ok {
		r.brokerWaiting.Add(-1)
	}
}

// terminalIfInvalid marks an error that retrying cannot fix as terminal: the
// same event will never fit, so the bridge waits for the Student to change.
func terminalIfInvalid(err error) error {
	if statusview.FailureReason(err) == studentv1.ReasonInvalid {
		return reconcile.TerminalError(err)
	}
	return err
}

// removeRecord removes the record of a Student that is gone, and the
// receipts services wrote about it.
func (r *StudentReconciler) removeRecord(ctx context.Context, uid types.UID) error {
	if err := r.records.Remove(ctx, uid); err != nil {
		return err
	}
	return r.receipts.Forget(ctx, string(uid))
}

// CatchUp queues what changed while no bridge ran, ahead of the rest of
// the start's catch-up (the watch's initial list, queued below live
// changes): the Students whose state differs from what was last published
// or that are being deleted, and the records the cache has no Student for
// (deleted, or out of scope). Call it once the cache has synced and
// Records are loaded. It returns how many of each it queued.
func (r *StudentReconciler) CatchUp(ctx context.Context, cached client.Reader) (changed, gone int, err error) {
	// Read only: the events carry the cached objects to the queue, which
	// reads their names.
	students, records, err := r.cachedAndGone(ctx, cached)
	if err != nil {
		return 0, 0, err
	}
	var objs []*studentv1.Student
	for _, s := range students {
		if r.needsPublish(s) && r.shards.Owns(client.ObjectKeyFromObject(s)) {
			objs = append(objs, s)
		}
	}
	changed = len(objs)
	for _, rec := range records {
		objs = append(objs, recordedStudent(rec))
	}
	n, err := r.enqueue(ctx, objs)
	return min(n, changed), max(n-changed, 0), err
}

// needsPublish says whether s has a change to publish: it is being
// deleted, or its state is not what was last published.
func (r *StudentReconciler) needsPublish(s *studentv1.Student) bool {
	return !s.DeletionTimestamp.IsZero() || contract.NextChange(s, lastPublished(r.records.Get(s.UID))) != ""
}

// cachedAndGone lists the Students in the cache, and the records of those
// the cache has no Student for (deleted, or out of scope). The Students
// are shallow copies of the cache's, to be read only. A list per watched
// namespace: one across the namespaces of a multi-namespace cache copies
// every Student twice, which a restart and a failover wait for.
func (r *StudentReconciler) cachedAndGone(ctx context.Context, cached client.Reader) ([]*studentv1.Student, []studentv1.StudentRecord, error) {
	namespaces := r.namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	var students []*studentv1.Student
	for _, ns := range namespaces {
		var list studentv1.StudentList
		if err := cached.List(ctx, &list, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
			return nil, nil, fmt.Errorf("list cached students: %w", err)
		}
		if students == nil {
			students = make([]*studentv1.Student, 0, len(list.Items))
		}
		for i := range list.Items {
			students = append(students, &list.Items[i])
		}
	}
	live := make(map[types.UID]bool, len(students))
	for _, s := range students {
		live[s.UID] = true
	}
	var gone []studentv1.StudentRecord
	for _, rec := range r.records.All() {
		if !live[rec.UID] {
			gone = append(gone, rec)
		}
	}
	return students, gone, nil
}

// enqueue hands objs to the controller as cache events would, and returns
// how many it handed over before ctx ended.
func (r *StudentReconciler) enqueue(ctx context.Context, objs []*studentv1.Student) (int, error) {
	keys := make([]types.NamespacedName, len(objs))
	for i, o := range objs {
		keys[i] = client.ObjectKeyFromObject(o)
	}
	r.catchUps.add(keys...)
	for i, o := range objs {
		select {
		case r.toQueue <- event.TypedGenericEvent[*studentv1.Student]{Object: o}:
		case <-ctx.Done():
			return i, ctx.Err()
		}
	}
	return len(objs), nil
}

// ShardOwner is the part of shard ownership the reconciler asks: whether
// a Student is this replica's (Owns, and Begin for work on it; done ends
// the work), and that a shard was lost to another replica (Lost).
type ShardOwner interface {
	Owns(key types.NamespacedName) bool
	Begin(key types.NamespacedName) (done func(), ok bool)
	Lost(key types.NamespacedName)
}

// EnqueueShard looks at every Student the cache has, and every record
// without a Student, for which in is true: what a replica that gained a
// shard must take over. It queues those that need a reconcile (what
// changed, what lost its finalizer, what is gone: what the shard's
// consumers are waiting for) and asks only for the status view of the
// others, as a start does (watchHandler). It returns how many it queued.
func (r *StudentReconciler) EnqueueShard(ctx context.Context, cached client.Reader, in func(types.NamespacedName) bool) (int, error) {
	// Read only, as in CatchUp.
	students, gone, err := r.cachedAndGone(ctx, cached)
	if err != nil {
		return 0, err
	}
	var objs []*studentv1.Student
	for _, s := range students {
		switch key := client.ObjectKeyFromObject(s); {
		case !in(key):
		case r.needsReconcile(s):
			objs = append(objs, s)
		default:
			r.status.Enqueue(key)
		}
	}
	for _, rec := range gone {
		if in(types.NamespacedName{Namespace: rec.Namespace, Name: rec.Name}) {
			objs = append(objs, recordedStudent(rec))
		}
	}
	return r.enqueue(ctx, objs)
}

// Unpublished counts, by group, the changes seen and not yet published: a
// Student whose state differs from its last published event, and a record
// whose Student is gone and not yet published as deleted. group puts a
// Student in its group, or leaves it out (false).
func (r *StudentReconciler) Unpublished(ctx context.Context, cached client.Reader, group func(types.NamespacedName) (int, bool)) (map[int]int, error) {
	// Read only: no need to copy every cached Student.
	students, gone, err := r.cachedAndGone(ctx, cached)
	if err != nil {
		return nil, err
	}
	out := map[int]int{}
	for _, s := range students {
		if g, ok := group(client.ObjectKeyFromObject(s)); ok && contract.NextChange(s, lastPublished(r.records.Get(s.UID))) != "" {
			out[g]++
		}
	}
	for _, rec := range gone {
		g, ok := group(types.NamespacedName{Namespace: rec.Namespace, Name: rec.Name})
		if last := lastPublished(rec, true); ok && (last == nil || last.Type != studentv1.EventTypeDeleted) {
			out[g]++
		}
	}
	return out, nil
}

// toQueueSize is how many Students handed to the controller's queue by
// enqueue (a catch-up) wait for it before enqueue waits.
const toQueueSize = 1024

// finalizerAttempts is how often a reconcile tries to patch the finalizer
// before it gives up until the next reconcile: each conflict is read again
// from the API server.
const finalizerAttempts = 5

// SetupWithManager registers the reconciler with mgr.
func (r *StudentReconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	if opts.LogConstructor == nil {
		// The values controller-runtime's builder gives a controller made
		// with For: the Students' watch is made with Watches, for its
		// handler.
		log := mgr.GetLogger().WithValues("controller", ControllerName, "controllerGroup", studentv1.GroupVersion.Group, "controllerKind", "Student")
		opts.LogConstructor = func(req *reconcile.Request) logr.Logger {
			if req == nil {
				return log
			}
			return log.WithValues("Student", klog.KRef(req.Namespace, req.Name), "namespace", req.Namespace, "name", req.Name)
		}
	}
	if opts.NewQueue == nil {
		// A catch-up waits behind live changes for queue.LowPriorityWait at
		// most. The start's catch-up is held open until the workers
		// start: the watch's initial list is all queued then.
		opts.NewQueue = queue.NewAging(queue.LowPriorityWait, mgr.GetLogger().WithName("queue"), func() func() {
			release := r.catchUps.hold()
			return func() { release(); r.workersStarted() }
		})
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		WatchesRawSource(newStudentWatch(mgr.GetCache(), r.watchHandler(), r.predicates()...)).
		WatchesRawSource(source.Channel(r.toQueue, &handler.TypedEnqueueRequestForObject[*studentv1.Student]{})).
		WithOptions(opts).
		Complete(r)
}

// predicates are the filters of the Students' watch, in order. Each only
// filters: what the bridge does when a change arrives, the watch handler
// does.
func (r *StudentReconciler) predicates() []predicate.Predicate {
	return []predicate.Predicate{changePredicate(), r.ours()}
}

// ours drops, with shards, the changes of Students of shards another
// replica holds: the cache keeps them (for a handover), nothing else does.
// A change dropped while its shard is being gained is not lost: the shard's
// Students are queued from the cache once it is held.
func (r *StudentReconciler) ours() predicate.Predicate {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		if r.shards.Owns(client.ObjectKeyFromObject(o)) {
			return true
		}
		otherShardChanges.Inc()
		return false
	})
}

// changePredicate lets through the updates that can need an event or a
// finalizer: spec (generation), labels, deletion, and the bridge's finalizer
// removed by someone else (it must go back on). The bridge's own writes,
// its finalizer added and its status, and annotation updates are dropped
// before they reach the queue: the reconcile that added the finalizer went
// on to publish, and a second one would only try again what failed.
func changePredicate() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld, e.ObjectNew
			return o.GetGeneration() != n.GetGeneration() ||
				!equality.Semantic.DeepEqual(o.GetLabels(), n.GetLabels()) ||
				!equality.Semantic.DeepEqual(o.GetDeletionTimestamp(), n.GetDeletionTimestamp()) ||
				controllerutil.ContainsFinalizer(o, studentv1.Finalizer) && !controllerutil.ContainsFinalizer(n, studentv1.Finalizer) && n.GetDeletionTimestamp() == nil
		},
	}
}

// debug is the reconcile's logger at V(1). log.FromContext copies the
// logger (WithValues) on every call, which a line that is off should not
// cost on every change.
func debug(ctx context.Context) logr.Logger {
	l, err := logr.FromContext(ctx)
	if err != nil {
		l = log.Log
	}
	return l.V(1)
}
