package queue

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// The aging queue's promises: live changes go before a catch-up's
// Students (queued low, as controller-runtime queues a watch's initial
// list); a catch-up none of whose Students a worker took for maxWait is
// raised, in the order it was queued, behind what is queued then; a retry
// is never low; the start is told once, when a worker first asks.

func newTestQueue(t testing.TB, maxWait time.Duration) (*agingQueue, *int) {
	t.Helper()
	started := new(int)
	q := NewAging(maxWait, logr.Discard(), func() func() {
		return func() { *started++ }
	})(t.Name(), workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]()).(*agingQueue)
	t.Cleanup(q.ShutDown)
	return q, started
}

func req(name string) reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}}
}

func addLow(q *agingQueue, names ...string) {
	for _, n := range names {
		q.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(handler.LowPriority)}, req(n))
	}
}

// settle waits until the queue holds n items: adds reach it through a
// buffer, and an add After a delay once the delay passed. The tests run in
// a synctest bubble: time moves on only when every goroutine of the queue
// is blocked, so a sleep here waits for the queue, not for the clock.
func settle(t *testing.T, q *agingQueue, n int) {
	t.Helper()
	for range 1000 {
		synctest.Wait()
		if q.Len() == n {
			return
		}
		time.Sleep(time.Millisecond) // fake time: the next delay due
	}
	t.Fatalf("the queue holds %d items, want %d", q.Len(), n)
}

// take gets the next item and marks it done, as a worker does.
func take(q *agingQueue) (string, int) {
	item, priority, _ := q.GetWithPriority()
	q.Done(item)
	return item.Name, priority
}

func TestAgingQueueLiveChangesFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, started := newTestQueue(t, time.Hour)
		addLow(q, "catch-up-1", "catch-up-2")
		q.Add(req("live"))
		settle(t, q, 3)
		if *started != 0 {
			t.Fatal("the start was told before a worker asked")
		}
		var got []string
		for range 3 {
			name, _ := take(q)
			got = append(got, name)
		}
		if want := "[live catch-up-1 catch-up-2]"; fmt.Sprint(got) != want {
			t.Errorf("taken %v, want %s", got, want)
		}
		if *started != 1 {
			t.Errorf("the start was told %d times, want once", *started)
		}
	})
}

// TestAgingQueueRaisesAStarvedCatchUp: live changes keep every worker
// busy (one is always queued when a worker asks). Without aging the
// catch-up would never come out (controller-runtime#3496).
func TestAgingQueueRaisesAStarvedCatchUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxWait = 50 * time.Millisecond
		q, _ := newTestQueue(t, maxWait)
		starveCatchUp(t, q, "c1", "c2", "c3", "c4", "c5")
	})
}

// TestAgingQueueRaisesEveryStarvedCatchUp: the queue checks on a catch-up
// only while one waits; a second one, queued after the first was raised
// and the queue was idle, is raised too.
func TestAgingQueueRaisesEveryStarvedCatchUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxWait = 50 * time.Millisecond
		q, _ := newTestQueue(t, maxWait)
		starveCatchUp(t, q, "c1", "c2", "c3")
		for q.Len() > 0 {
			take(q)
		}
		time.Sleep(time.Hour) // fake time: idle
		starveCatchUp(t, q, "c4", "c5")
	})
}

// starveCatchUp queues catchUp low, then keeps the workers busy with live
// changes a millisecond apart until every Student of it came out: raised
// to the default priority, together and in the order it was queued.
func starveCatchUp(t *testing.T, q *agingQueue, catchUp ...string) {
	t.Helper()
	addLow(q, catchUp...)
	settle(t, q, len(catchUp))
	var got []string
	var priorities []int
	for i := 0; len(got) < len(catchUp); i++ {
		if i > 2000 {
			t.Fatalf("after %d live changes the catch-up is still waiting (taken %v)", i, got)
		}
		q.Add(req(fmt.Sprint("live-", i)))
		q.Len()                      // flushes the add
		time.Sleep(time.Millisecond) // fake time: live changes a millisecond apart
		name, priority := take(q)
		if name[0] == 'c' {
			got = append(got, name)
			priorities = append(priorities, priority)
		} else if len(got) > 0 {
			t.Fatalf("live change %s went between the raised catch-up's Students (%v)", name, got)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(catchUp) {
		t.Errorf("the catch-up came out as %v, want the order it was queued in: %v", got, catchUp)
	}
	for i, p := range priorities {
		if p != 0 {
			t.Errorf("%s came out at priority %d, want raised to 0", got[i], p)
		}
	}
}

// TestAgingQueueLeavesAProgressingCatchUpLow: while workers take the
// catch-up's Students, it stays below live changes.
func TestAgingQueueLeavesAProgressingCatchUpLow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxWait = 300 * time.Millisecond
		q, _ := newTestQueue(t, maxWait)
		names := make([]string, 8)
		for i := range names {
			names[i] = fmt.Sprint("c", i)
		}
		addLow(q, names...)
		settle(t, q, len(names))
		for range names {
			time.Sleep(maxWait / 3) // fake time: a worker takes one every maxWait/3
			if name, priority := take(q); priority != handler.LowPriority {
				t.Fatalf("%s came out at priority %d while the catch-up progressed every %s; want it left at %d", name, priority, maxWait/3, handler.LowPriority)
			}
		}
	})
}

// TestAgingQueueRetryIsNotLow: a Student of a catch-up queued again after
// a failure (rate limited, or after a delay) was tried already: it goes at
// the default priority, and the aging never raises it early (which would
// cut its backoff short).
func TestAgingQueueRetryIsNotLow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, _ := newTestQueue(t, time.Hour)
		q.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(handler.LowPriority), After: time.Millisecond}, req("delayed"))
		q.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(handler.LowPriority), RateLimited: true}, req("rate-limited"))
		settle(t, q, 2)
		for range 2 {
			if name, priority := take(q); priority != 0 {
				t.Errorf("the retry %s came out at priority %d, want 0", name, priority)
			}
		}
		q.mu.Lock()
		defer q.mu.Unlock()
		if len(q.low) != 0 {
			t.Errorf("the aging holds %d retries to raise, want none", len(q.low))
		}
	})
}
