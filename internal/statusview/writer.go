// Package statusview is the status the bridge shows on each Student, for
// people: lastPublished, the Published condition and the services'
// receipts. Top to bottom: a reconcile (or a receipt, or a failure) calls
// Writer.Enqueue; the writer, on its budget, asks its view function (the
// reconciler's View) for what the Student should show, which is View of
// its record and last failure (with publishedCondition) and the services'
// receipts (Receipts.ApplyTo, in receipts.go), and writes it if it
// differs from what the Student shows. The bridge never reads it back.
package statusview

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stages"
)

const (
	resultSuccess = "success"
	resultError   = "error"
)

var statusWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "student_bridge_status_writes_total",
	Help: "Status writes of the status view, by result (success, error).",
}, []string{"result"})

// Writer writes the status view of Students after the fact: what the
// bridge published is already in the record store, the status only shows
// it to people. Writes are coalesced per Student (the latest view wins when
// the write happens), at most QPS per second, and wait while Busy says
// changes are waiting for the API server; failures skip that wait, so a
// stuck Student shows why promptly.
//
// A nil *Writer is a bridge that writes no status: its methods do nothing.
type Writer struct {
	client client.Client
	view   func(stu *studentv1.Student) studentv1.StudentStatus
	busy   func() bool
	owns   func(types.NamespacedName) bool
	log    logr.Logger

	// queue holds the Students asked for and when each was first asked
	// for since its last write: the status stage's start.
	queue   *backlog
	limiter *rate.Limiter
}

// WriterOptions are a Writer's settings; each zero value is a default.
type WriterOptions struct {
	// QPS bounds the writes per second (SetQPS changes it while the
	// writer runs, for a replica's share).
	QPS float64
	// Busy reports that changes are waiting; nil never waits.
	Busy func() bool
	// Owns says whether this replica writes key's status (its shard);
	// nil writes every Student's.
	Owns func(types.NamespacedName) bool
	Log  logr.Logger
}

// NewWriter returns a Writer that reads Students from c's cache and writes
// the status view returns; add it to the manager to run it.
func NewWriter(c client.Client, view func(*studentv1.Student) studentv1.StudentStatus, o WriterOptions) *Writer {
	busy, owns := o.Busy, o.Owns
	if busy == nil {
		busy = func() bool { return false }
	}
	if owns == nil {
		owns = func(types.NamespacedName) bool { return true }
	}
	return &Writer{
		client:  c,
		view:    view,
		busy:    busy,
		owns:    owns,
		log:     o.Log,
		queue:   newBacklog(),
		limiter: rate.NewLimiter(rate.Limit(o.QPS), 1),
	}
}

// Enqueue asks for the status of key to be written; asking again before the
// write costs nothing.
func (w *Writer) Enqueue(key types.NamespacedName) {
	if w != nil {
		w.queue.add(key, time.Now())
	}
}

// EnqueueUnchanged asks for the status of key, a Student a start found
// published as it is, to be written once nothing else waits (see
// backlog).
func (w *Writer) EnqueueUnchanged(key types.NamespacedName) {
	if w != nil {
		w.queue.addUnchanged(key, time.Now())
	}
}

// Waiting says how many Students wait for a write: those asked for since
// their last write, and the unchanged ones a start asked for.
func (w *Writer) Waiting() (asked, unchanged int) {
	if w == nil {
		return 0, 0
	}
	w.queue.mu.Lock()
	defer w.queue.mu.Unlock()
	return len(w.queue.asked), len(w.queue.unchanged) - w.queue.unchangedHead
}

// SetQPS changes the most status writes per second, e.g. to this replica's
// share of a budget for all replicas.
func (w *Writer) SetQPS(qps float64) {
	if w == nil {
		return
	}
	w.limiter.SetLimit(rate.Limit(qps))
}

// NeedLeaderElection is true: only the replica that publishes knows the view.
func (w *Writer) NeedLeaderElection() bool { return true }

// Start writes until ctx is cancelled.
func (w *Writer) Start(ctx context.Context) error {
	for {
		// Asks from now on are for a view computed after this write.
		key, asked, ok := w.queue.next(ctx)
		if !ok {
			return nil
		}
		if err := w.write(ctx, key, asked); err != nil {
			statusWrites.WithLabelValues(resultError).Inc()
			w.log.V(1).Info("status write failed", "student", key.String(), "reason", err.Error())
		}
	}
}

// write writes key's status view if it changed; asked is when it was
// first asked for (zero if not known).
func (w *Writer) write(ctx context.Context, key types.NamespacedName, asked time.Time) error {
	if !w.owns(key) {
		return nil
	}
	var stu studentv1.Student
	if err := w.client.Get(ctx, key, &stu); err != nil {
		return client.IgnoreNotFound(err)
	}
	view := w.view(&stu)
	if equality.Semantic.DeepEqual(stu.Status, TrimStatus(view)) {
		return nil
	}
	if !failing(view) {
		for w.busy() {
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
	if err := w.client.Get(ctx, key, &stu); err != nil {
		return client.IgnoreNotFound(err)
	}
	view = w.view(&stu)
	if equality.Semantic.DeepEqual(stu.Status, TrimStatus(view)) {
		return nil
	}
	// The whole status, replaced (the cache holds it trimmed, so a patch
	// computed from it could leave stale labels behind), and conditional on
	// the resourceVersion the view was computed from: a stale view never
	// lands, nor on a Student re-created with the name. The API server
	// ignores everything but status on this subresource.
	stu.Status = view
	if err := w.client.Status().Update(ctx, &stu); err != nil {
		if apierrors.IsConflict(err) {
			// Written again from a fresher cache; the wait goes on.
			w.queue.add(key, asked)
			return nil
		}
		return client.IgnoreNotFound(fmt.Errorf("write status of %s: %w", key, err))
	}
	statusWrites.WithLabelValues(resultSuccess).Inc()
	if !asked.IsZero() {
		stages.Observe(stages.Status, time.Since(asked))
	}
	return nil
}

var registerOnce sync.Once

// RegisterMetrics registers the status view's metrics with
// controller-runtime's registry, once per process, every series at 0.
func RegisterMetrics() {
	registerOnce.Do(func() {
		metrics.Registry.MustRegister(statusWrites, statusBacklog, receiptUpdates)
		statusWrites.WithLabelValues(resultSuccess)
		statusWrites.WithLabelValues(resultError)
		for _, result := range []string{"applied", "failed", "removed", "malformed", "unknownStudent"} {
			receiptUpdates.WithLabelValues(result)
		}
	})
}
