package reconciler

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var statusBacklog = prometheus.NewGauge(prometheus.GaugeOpts{
	Name: "student_bridge_status_backlog",
	Help: "Students whose status view waits for the status writer (at most status.qps writes a second).",
})

func init() { metrics.Registry.MustRegister(statusBacklog) }

// backlog is the status writer's queue: the Students whose status was asked
// for, each once, in the order first asked, with when that was. After a
// restart it holds every Student whose view the budget has not written yet
// (at 100,000 Students, most of them), so it is a map and a slice, about a
// hundred bytes a Student; a client-go work queue beside a sync.Map of the
// times took about 250.
type backlog struct {
	mu    sync.Mutex
	asked map[types.NamespacedName]time.Time // the keys waiting
	order []types.NamespacedName             // order[head:] is the queue
	head  int
	ready chan struct{} // holds a token while keys may be waiting
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
	statusBacklog.Set(float64(len(b.asked)))
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
		return types.NamespacedName{}, time.Time{}, false
	}
	key := b.order[b.head]
	b.order[b.head] = types.NamespacedName{}
	b.head++
	at := b.asked[key]
	delete(b.asked, key)
	statusBacklog.Set(float64(len(b.asked)))
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
