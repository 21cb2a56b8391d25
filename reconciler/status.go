package reconciler

// The status view, top to bottom: a reconcile (or a receipt, or a failure)
// calls StatusWriter.Enqueue; the writer, on its budget, asks the view
// function (StudentReconciler.View) for what the Student should show,
// which is StatusView of its record and last failure (with
// publishedCondition) and the services' receipts (Receipts.ApplyTo, in
// receipts.go), and writes it if it differs from what the Student shows.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unique"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stages"
)

var statusWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "student_bridge_status_writes_total",
	Help: "Status writes of the status view, by result (success, error).",
}, []string{"result"})

// StatusWriter writes the status view of Students after the fact: what the
// bridge published is already in the record store, the status only shows
// it to people. Writes are coalesced per Student (the latest view wins when
// the write happens), at most QPS per second, and wait while Busy says
// changes are waiting for the API server; failures skip that wait, so a
// stuck Student shows why promptly.
type StatusWriter struct {
	// Client reads Students from the cache and patches their status.
	Client client.Client
	// View returns the status stu should show.
	View func(stu *studentv1.Student) studentv1.StudentStatus
	// QPS bounds the writes per second.
	QPS float64
	// Busy reports that changes are waiting; nil never waits.
	Busy func() bool
	// Owns says whether this replica writes key's status (its shard);
	// nil writes every Student's.
	Owns func(types.NamespacedName) bool
	Log  logr.Logger

	// queue holds the Students asked for and when each was first asked
	// for since its last write: the status stage's start.
	queue   *backlog
	limiter *rate.Limiter
}

// NewStatusWriter returns a StatusWriter; add it to the manager to run it.
func NewStatusWriter(c client.Client, view func(*studentv1.Student) studentv1.StudentStatus, qps float64, busy func() bool, log logr.Logger) *StatusWriter {
	return &StatusWriter{
		Client:  c,
		View:    view,
		QPS:     qps,
		Busy:    busy,
		Log:     log,
		queue:   newBacklog(),
		limiter: rate.NewLimiter(rate.Limit(qps), 1),
	}
}

// Enqueue asks for the status of key to be written; asking again before the
// write costs nothing.
func (w *StatusWriter) Enqueue(key types.NamespacedName) {
	if w != nil {
		w.queue.add(key, time.Now())
	}
}

// EnqueueUnchanged asks for the status of key, a Student a start found
// published as it is, to be written once nothing else waits (see
// backlog).
func (w *StatusWriter) EnqueueUnchanged(key types.NamespacedName) {
	if w != nil {
		w.queue.addUnchanged(key, time.Now())
	}
}

// SetQPS changes the most status writes per second, e.g. to this replica's
// share of a budget for all replicas.
func (w *StatusWriter) SetQPS(qps float64) {
	w.limiter.SetLimit(rate.Limit(qps))
}

// NeedLeaderElection is true: only the replica that publishes knows the view.
func (w *StatusWriter) NeedLeaderElection() bool { return true }

// Start writes until ctx is cancelled.
func (w *StatusWriter) Start(ctx context.Context) error {
	for {
		// Asks from now on are for a view computed after this write.
		key, asked, ok := w.queue.next(ctx)
		if !ok {
			return nil
		}
		if err := w.write(ctx, key, asked); err != nil {
			statusWrites.WithLabelValues(resultError).Inc()
			w.Log.V(1).Info("status write failed", "student", key.String(), "reason", err.Error())
		}
	}
}

// write writes key's status view if it changed; asked is when it was
// first asked for (zero if not known).
func (w *StatusWriter) write(ctx context.Context, key types.NamespacedName, asked time.Time) error {
	if w.Owns != nil && !w.Owns(key) {
		return nil
	}
	var stu studentv1.Student
	if err := w.Client.Get(ctx, key, &stu); err != nil {
		return client.IgnoreNotFound(err)
	}
	view := w.View(&stu)
	if equality.Semantic.DeepEqual(stu.Status, TrimStatus(view)) {
		return nil
	}
	if !failing(view) {
		for w.Busy != nil && w.Busy() {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	if err := w.limiter.Wait(ctx); err != nil {
		return nil // shutting down
	}
	// Read again: the wait may have been long, and the view must be of the
	// Student as it is now.
	if err := w.Client.Get(ctx, key, &stu); err != nil {
		return client.IgnoreNotFound(err)
	}
	view = w.View(&stu)
	if equality.Semantic.DeepEqual(stu.Status, TrimStatus(view)) {
		return nil
	}
	// The whole status, replaced (the cache holds it trimmed, so a patch
	// computed from it could leave stale labels behind), and conditional on
	// the resourceVersion the view was computed from: a stale view never
	// lands, nor on a Student re-created with the name. The API server
	// ignores everything but status on this subresource.
	stu.Status = view
	if err := w.Client.Status().Update(ctx, &stu); err != nil {
		if apierrors.IsConflict(err) {
			// Written again from a fresher cache; the wait goes on.
			w.queue.add(key, asked)
			return nil
		}
		return client.IgnoreNotFound(fmt.Errorf("write status of %s: %w", key, err))
	}
	statusWrites.WithLabelValues(resultSuccess).Inc()
	if !asked.IsZero() {
		since(stages.Status, asked)
	}
	return nil
}

func failing(s studentv1.StudentStatus) bool {
	c := meta.FindStatusCondition(s.Conditions, studentv1.ConditionPublished)
	return c != nil && c.Status == metav1.ConditionFalse
}

// TrimStatus is status as the bridge's cache keeps it: lastPublished
// without the spec and labels that were published (the record store has
// them; the cache need not hold them twice), and the Published condition
// without its message where the message says only what lastPublished does
// (publishedMessage). The view is trimmed alike before it is compared with
// what the cache holds, so statuses that differ still differ trimmed.
func TrimStatus(s studentv1.StudentStatus) studentv1.StudentStatus {
	if s.LastPublished == nil {
		return s
	}
	lp := *s.LastPublished
	lp.Spec, lp.Labels = studentv1.StudentSpec{}, nil
	s.LastPublished = &lp
	i := slices.IndexFunc(s.Conditions, func(c metav1.Condition) bool { return c.Type == studentv1.ConditionPublished })
	if i >= 0 && s.Conditions[i].Reason == studentv1.ReasonPublished && isPublishedMessage(s.Conditions[i].Message, &lp) {
		s.Conditions = slices.Clone(s.Conditions) // the caller's stay whole
		s.Conditions[i].Message = ""
	}
	return s
}

// TrimForCache is what the bridge's cache keeps of a Student it watches:
// no managed fields nor annotations (never published nor read), the status
// trimmed (TrimStatus), and the strings most Students share (namespace,
// finalizers, the event type, the conditions' type, status and reason)
// held once rather than once per Student.
func TrimForCache(s *studentv1.Student) {
	s.ManagedFields = nil
	s.Annotations = nil
	s.Namespace = intern(s.Namespace)
	for i, f := range s.Finalizers {
		s.Finalizers[i] = intern(f)
	}
	s.Status = TrimStatus(s.Status)
	if lp := s.Status.LastPublished; lp != nil {
		lp.Type = intern(lp.Type)
	}
	for i := range s.Status.Conditions {
		c := &s.Status.Conditions[i]
		c.Type, c.Status, c.Reason = intern(c.Type), metav1.ConditionStatus(intern(string(c.Status))), intern(c.Reason)
	}
}

// intern returns s held once for the process: a string many Students share
// (a namespace, an event type) costs its bytes once, not once per Student.
func intern(s string) string {
	if s == "" {
		return s
	}
	return unique.Make(s).Value()
}

// publishedMessage is the message of the Published condition once last is
// what the Student shows.
func publishedMessage(last *studentv1.PublishedEvent) string {
	return fmt.Sprintf("%s %s published as stream sequence %d", last.Type, last.ID, last.Sequence)
}

// isPublishedMessage reports whether m is publishedMessage(last), without
// building it.
func isPublishedMessage(m string, last *studentv1.PublishedEvent) bool {
	rest, ok := strings.CutPrefix(m, last.Type)
	for _, part := range []string{" ", last.ID, " published as stream sequence "} {
		if !ok {
			return false
		}
		rest, ok = strings.CutPrefix(rest, part)
	}
	var digits [20]byte
	return ok && rest == string(strconv.AppendInt(digits[:0], last.Sequence, 10))
}

// StatusView is the status stu shows, given the event last published for it
// (nil if none) and the last publish failure (nil if none). Conditions
// other than Published are kept as they are.
func StatusView(stu *studentv1.Student, last *studentv1.PublishedEvent, failure error) studentv1.StudentStatus {
	s := *stu.Status.DeepCopy()
	s.LastPublished = last.DeepCopy()
	s.ObservedGeneration = stu.Generation
	meta.SetStatusCondition(&s.Conditions, publishedCondition(stu, last, failure))
	return s
}

// View is the status stu should show now: StatusView of its record and last
// failure.
func (r *StudentReconciler) View(stu *studentv1.Student) studentv1.StudentStatus {
	var failure error
	if v, ok := r.failures.Load(client.ObjectKeyFromObject(stu)); ok {
		failure = v.(error)
	}
	last := lastPublished(r.Records.Get(stu.UID))
	s := StatusView(stu, last, failure)
	r.Receipts.ApplyTo(&s, string(stu.UID), last)
	return s
}

// publishedCondition is the Published condition of stu: False with the
// last failure, True once what was last published is its current state,
// Unknown (Pending) before.
func publishedCondition(stu *studentv1.Student, last *studentv1.PublishedEvent, pubErr error) metav1.Condition {
	c := metav1.Condition{
		Type:               studentv1.ConditionPublished,
		ObservedGeneration: stu.Generation,
	}
	switch {
	case pubErr != nil:
		c.Status = metav1.ConditionFalse
		c.Reason = failureReason(pubErr)
		c.Message = pubErr.Error()
	case last != nil && contract.NextChange(stu, last) == "":
		c.Status = metav1.ConditionTrue
		c.Reason = studentv1.ReasonPublished
		c.Message = publishedMessage(last)
	default:
		c.Status = metav1.ConditionUnknown
		c.Reason = "Pending"
		c.Message = "the current state is not published yet"
	}
	return c
}
