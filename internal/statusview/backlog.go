package statusview

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
)

var statusBacklog = prometheus.NewGauge(prometheus.GaugeOpts{
	Name: "student_bridge_status_backlog",
	Help: "Students whose status view waits for the status writer (at most status.qps writes a second).",
})

// backlog is the status writer's queue: the Students whose status was asked
// for, each once, in the order first asked, with when that was. A map and a
// slice: a client-go work queue beside a sync.Map of the times takes
// several times the memory.
//
// A start asks for the view of every Student its initial list found
// published as it is (unchanged): after a restart that is nearly all of
// them, and after a bulk import most have a view the budget never wrote. Those
// are kept apart, as a plain list asked for at one time (a key each, not
// a queue entry and a time), and taken once nothing else waits: a Student
// asked for since is written first, and again from the list only if its
// view changed meanwhile.
type backlog struct {
	mu    sync.Mutex
	asked map[types.NamespacedName]time.Time // the keys waiting
	order []types.NamespacedName             // order[head:] is the queue
	head  int
	// unchanged[unchangedHead:] waits after the queue, asked for at
	// unchangedAt.
	unchanged     []types.NamespacedName
	unchangedHead int
	unchangedAt   time.Time
	ready         chan struct{} // holds a token while keys may be waiting
}

func newBacklog() *backlog { return &backlog{ready: make(chan struct{}, 1)} }

// add queues key, asked for at; a key already waiting keeps its place and
// its time.
func (b *backlog) add(key types.NamespacedName, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.asked[key]; ok {
		return
	}
	if b.asked == nil {
		b.asked = map[types.NamespacedName]time.Time{}
	}
	b.asked[key] = at
	b.order = append(b.order, key)
	b.changedLocked()
}

// addUnchanged queues key, a Student a start found published as it is,
// asked for at, behind every other key (see backlog).
func (b *backlog) addUnchanged(key types.NamespacedName, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.unchangedHead == len(b.unchanged) {
		b.unchangedAt = at
	}
	b.unchanged = append(b.unchanged, key)
	b.changedLocked()
}

// changedLocked updates the gauge and wakes next.
func (b *backlog) changedLocked() {
	b.gaugeLocked()
	select {
	case b.ready <- struct{}{}:
	default:
	}
}

// next takes the first key waiting and when it was asked for, waiting for
// one until ctx is done (ok false). Asking for the key again from now on
// queues it again.
func (b *backlog) next(ctx context.Context) (key types.NamespacedName, at time.Time, ok bool) {
	for {
		if key, at, ok = b.pop(); ok {
			return key, at, true
		}
		select {
		case <-b.ready:
		case <-ctx.Done():
			return key, at, false
		}
	}
}

func (b *backlog) pop() (types.NamespacedName, time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.head == len(b.order) {
		return b.popUnchangedLocked()
	}
	key := b.order[b.head]
	b.order[b.head] = types.NamespacedName{}
	b.head++
	at := b.asked[key]
	delete(b.asked, key)
	b.gaugeLocked()
	switch {
	case len(b.asked) == 0:
		// Neither a map nor a slice gives memory back as it empties: let a
		// restart's go once it is written.
		b.asked, b.order, b.head = nil, nil, 0
	case b.head > len(b.order)/2:
		b.order, b.head = append([]types.NamespacedName(nil), b.order[b.head:]...), 0
	}
	return key, at, true
}

func (b *backlog) popUnchangedLocked() (types.NamespacedName, time.Time, bool) {
	if b.unchangedHead == len(b.unchanged) {
		return types.NamespacedName{}, time.Time{}, false
	}
	key := b.unchanged[b.unchangedHead]
	b.unchanged[b.unchangedHead] = types.NamespacedName{} // its strings may go
	b.unchangedHead++
	if b.unchangedHead == len(b.unchanged) {
		b.unchanged, b.unchangedHead = nil, 0
	}
	b.gaugeLocked()
	return key, b.unchangedAt, true
}

// gaugeLocked sets student_bridge_status_backlog to the keys waiting.
func (b *backlog) gaugeLocked() {
	statusBacklog.Set(float64(len(b.asked) + len(b.unchanged) - b.unchangedHead))
}
