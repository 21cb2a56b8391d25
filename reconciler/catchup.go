package reconciler

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

var (
	catchUpPending = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "student_bridge_catch_up_students",
		Help: "Students a catch-up queued (a start's initial list, the records of Students gone while no bridge ran, a gained shard) and not yet reconciled.",
	})
	catchUpDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "student_bridge_catch_up_duration_seconds",
		Help:    "How long each catch-up took, from its first Student queued to its last reconciled.",
		Buckets: prometheus.ExponentialBuckets(0.1, 2, 14),
	})
	caughtUpAt = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "student_bridge_catch_up_end_time_seconds",
		Help: "When the last catch-up ended (every Student it queued reconciled), in seconds since the Unix epoch. 0 before.",
	})
	publishingSince = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "student_bridge_publishing_start_time_seconds",
		Help: "When the bridge could first publish, in seconds since the Unix epoch: its records loaded and its workers started (the cache synced). 0 before.",
	})
)

// catchUpTracker tracks the Students the bridge must look at again because it was
// away from them: after a start (the watch's initial list, and the records
// whose Students are gone) or when it gained a shard. A catch-up ends when
// every one of them was reconciled without an error and nothing holds it
// open.
type catchUpTracker struct {
	mu      sync.Mutex
	pending map[types.NamespacedName]struct{}
	holds   int
	started time.Time
	queued  int
}

// add counts keys as queued by a catch-up. None starts none: a gained
// shard whose Students need no reconcile has nothing to catch up with.
func (c *catchUpTracker) add(keys ...types.NamespacedName) {
	if len(keys) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		c.pending = map[types.NamespacedName]struct{}{}
	}
	c.begin()
	for _, k := range keys {
		if _, ok := c.pending[k]; !ok {
			c.pending[k] = struct{}{}
			c.queued++
		}
	}
	catchUpPending.Set(float64(len(c.pending)))
}

// hold keeps a catch-up open until release is called: while more of it is
// still to be queued.
func (c *catchUpTracker) hold() (release func()) {
	c.mu.Lock()
	c.begin()
	c.holds++
	c.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.holds--
			c.endIfDone()
		})
	}
}

// done counts key as reconciled.
func (c *catchUpTracker) done(key types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.pending[key]; !ok {
		return
	}
	delete(c.pending, key)
	catchUpPending.Set(float64(len(c.pending)))
	if len(c.pending) == 0 {
		c.pending = nil // a map never shrinks: let a catch-up's go
	}
	c.endIfDone()
}

// begin starts a catch-up if none is going on.
func (c *catchUpTracker) begin() {
	if len(c.pending) == 0 && c.holds == 0 {
		c.started, c.queued = time.Now(), 0
	}
}

func (c *catchUpTracker) endIfDone() {
	if len(c.pending) > 0 || c.holds > 0 || c.started.IsZero() {
		return
	}
	took := time.Since(c.started)
	catchUpDuration.Observe(took.Seconds())
	caughtUpAt.SetToCurrentTime()
	ctrl.Log.WithName("catch-up").Info("caught up: every Student queued was reconciled", "students", c.queued, "took", took.Round(time.Millisecond).String())
	c.started = time.Time{}
}

// Pending is how many Students the current catch-up has still to
// reconcile.
func (c *catchUpTracker) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

// workersStarted is called when the controller's workers first ask for
// work: nothing can be published before, nor before the records are
// loaded. Changes made from then on are the ones a restart can publish
// at once.
func (r *StudentReconciler) workersStarted() {
	r.records.WhenLoaded(publishingSince.SetToCurrentTime)
}

// HoldCatchUp keeps the start's catch-up open until release is called:
// call it before the records load, and release once the records of
// Students gone while no bridge ran are queued (CatchUp).
func (r *StudentReconciler) HoldCatchUp() (release func()) { return r.catchUps.hold() }

// CatchUpPending is how many Students queued by a catch-up are not
// reconciled yet.
func (r *StudentReconciler) CatchUpPending() int { return r.catchUps.Pending() }

// initialListWait bounds how long the watch's initial list waits for the
// records' first load: a cache that syncs before them would otherwise
// queue every Student.
const initialListWait = 10 * time.Second

// recordsForInitialList reports whether the records are loaded, the first
// call waiting for them at most initialListWait.
func (r *StudentReconciler) recordsForInitialList() bool {
	r.listWait.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), initialListWait)
		defer cancel()
		_ = r.records.Wait(ctx) // not loaded in time: Loaded says so
	})
	return r.records.Loaded()
}

// needsReconcile says whether a reconcile of s has anything to do beyond
// its status: a change to publish, or the finalizer to put back.
func (r *StudentReconciler) needsReconcile(s *studentv1.Student) bool {
	return r.needsPublish(s) || r.holdWithFinalizer && !controllerutil.ContainsFinalizer(s, studentv1.Finalizer)
}
