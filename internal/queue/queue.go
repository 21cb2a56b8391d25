// Package queue is the reconciler's work queue: controller-runtime's
// priority queue in which a catch-up (the low priority items of a watch's
// initial list) cannot be starved by live changes.
package queue

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// LowPriorityWait is the longest the Students queued below the default
// priority wait with none of them taken by a worker: then they are raised
// to it.
//
// controller-runtime's priority queue gives the Students of a watch's
// initial list (a restart's catch-up) a low priority, so live changes go
// first. Under a steady stream of live changes that keeps the workers
// busy, the low ones would never come out (controller-runtime#3496), and
// they are where the deletes made while no bridge ran get published.
// While workers take low ones, live changes keep going first; once none
// was taken for LowPriorityWait, those waiting take their turn behind what
// is queued then, ahead of what comes later: a catch-up cannot be
// starved.
const LowPriorityWait = 5 * time.Second

// agingQueue is controller-runtime's priority queue in which the items
// below the default priority are raised to it when none of them was taken
// for maxWait. A retry (rate
// limited, or after a delay) is queued at the default priority at once:
// it was tried already, and raising a waiting item would cut its backoff
// short.
type agingQueue struct {
	priorityqueue.PriorityQueue[reconcile.Request]
	maxWait time.Duration

	mu sync.Mutex
	// low numbers each item below the default priority in the order it
	// was queued (a time would not: one call queues many at one instant).
	low    map[reconcile.Request]uint64
	queued uint64
	// progress is when a worker last took an item of low, or when low
	// was last empty.
	progress time.Time
	// lowQueued tells raise that low is no longer empty: it checks on low
	// only while it holds items, and nothing wakes the process for it
	// otherwise.
	lowQueued chan struct{}
	stop      chan struct{}
	once      sync.Once

	// working is called when a worker first asks for an item: the
	// controller starts its workers once its watch delivered the initial
	// list, so everything of it is queued by then.
	working     func()
	workingOnce sync.Once
}

// NewAging returns what controller.Options.NewQueue takes: an aging queue
// raising its low items after maxWait without progress. The
// controller makes its queue when it starts (on the leader, with leader
// election); starting calls (and the workers' first request ends)
// starting's release.
func NewAging(maxWait time.Duration, log logr.Logger, starting func() (release func())) func(string, workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
	return func(name string, rl workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
		q := &agingQueue{
			working: starting(),
			PriorityQueue: priorityqueue.New(name, func(o *priorityqueue.Opts[reconcile.Request]) {
				o.RateLimiter = rl
				o.Log = log
			}),
			maxWait:   maxWait,
			low:       map[reconcile.Request]uint64{},
			lowQueued: make(chan struct{}, 1),
			stop:      make(chan struct{}),
		}
		go q.raise()
		return q
	}
}

func (q *agingQueue) AddWithOpts(o priorityqueue.AddOpts, items ...reconcile.Request) {
	low := o.Priority != nil && *o.Priority < 0
	if low && (o.RateLimited || o.After > 0) {
		o.Priority, low = nil, false
	}
	now := time.Now()
	q.mu.Lock()
	if low && len(q.low) == 0 {
		q.progress = now
		select {
		case q.lowQueued <- struct{}{}:
		default: // raise is told already
		}
	}
	for _, it := range items {
		switch _, queued := q.low[it]; {
		case low && !queued:
			q.queued++
			q.low[it] = q.queued
		case !low:
			delete(q.low, it) // at the default priority now
		}
	}
	q.mu.Unlock()
	q.PriorityQueue.AddWithOpts(o, items...)
}

func (q *agingQueue) Add(item reconcile.Request) {
	q.AddWithOpts(priorityqueue.AddOpts{}, item)
}

func (q *agingQueue) AddAfter(item reconcile.Request, after time.Duration) {
	q.AddWithOpts(priorityqueue.AddOpts{After: after}, item)
}

func (q *agingQueue) AddRateLimited(item reconcile.Request) {
	q.AddWithOpts(priorityqueue.AddOpts{RateLimited: true}, item)
}

func (q *agingQueue) GetWithPriority() (reconcile.Request, int, bool) {
	q.workingOnce.Do(q.working)
	item, priority, shutdown := q.PriorityQueue.GetWithPriority()
	q.taken(item)
	return item, priority, shutdown
}

func (q *agingQueue) Get() (reconcile.Request, bool) {
	q.workingOnce.Do(q.working)
	item, shutdown := q.PriorityQueue.Get()
	q.taken(item)
	return item, shutdown
}

func (q *agingQueue) taken(item reconcile.Request) {
	q.mu.Lock()
	if _, ok := q.low[item]; ok {
		delete(q.low, item)
		q.progress = time.Now()
		if len(q.low) == 0 {
			q.low = map[reconcile.Request]uint64{} // a map never shrinks: let a catch-up's go
		}
	}
	q.mu.Unlock()
}

func (q *agingQueue) ShutDown() {
	q.once.Do(func() { close(q.stop) })
	q.PriorityQueue.ShutDown()
}

func (q *agingQueue) ShutDownWithDrain() {
	q.once.Do(func() { close(q.stop) })
	q.PriorityQueue.ShutDownWithDrain()
}

// raise raises, checking every quarter of maxWait while there are any,
// the items below the default priority once none of them was taken for
// maxWait. One taken by a worker in between is queued once more: a second
// reconcile, which publishes nothing new.
func (q *agingQueue) raise() {
	every := max(q.maxWait/4, 10*time.Millisecond)
	tick := time.NewTicker(every)
	tick.Stop() // until an item is queued below the default priority
	defer tick.Stop()
	for {
		select {
		case <-q.stop:
			return
		case <-q.lowQueued:
			tick.Reset(every)
		case now := <-tick.C:
			q.mu.Lock()
			if len(q.low) == 0 {
				tick.Stop() // until lowQueued
				q.mu.Unlock()
				continue
			}
			if now.Sub(q.progress) < q.maxWait {
				q.mu.Unlock()
				continue
			}
			due := make([]reconcile.Request, 0, len(q.low))
			for it := range q.low {
				due = append(due, it)
			}
			// In the order they were queued.
			slices.SortFunc(due, func(a, b reconcile.Request) int { return cmp.Compare(q.low[a], q.low[b]) })
			q.low = map[reconcile.Request]uint64{}
			tick.Stop()
			q.mu.Unlock()
			q.PriorityQueue.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(0)}, due...)
		}
	}
}
