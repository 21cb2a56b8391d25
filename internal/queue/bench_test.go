package queue

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/student-bridge/student-bridge/internal/runstat"
)

// benchWorkers is the bridge's default number of workers.
const benchWorkers = 16

// BenchmarkHandOff is what the queue costs one change when the workers
// keep up: an item added, taken by one of the idle workers and marked
// done before the next is added (the watch's handler queues a change, a
// worker reconciles it, the workers wait for the next). The work is
// nothing, so the figures are the queue's own: cpu-ns/op the process's
// CPU time, ctxsw/op its threads' context switches, each per change.
// "apart" is the time between two changes: none, or 10ms (100 changes a
// second, when the process's threads park between changes). "workqueue"
// is client-go's rate limiting queue, the one controller-runtime uses
// without priorities, as the reference: a worker woken straight from the
// add, where controller-runtime's priority queue hands an item on through
// goroutines of its own.
func BenchmarkHandOff(b *testing.B) {
	queues := []struct {
		name string
		new  func(b *testing.B) workqueue.TypedRateLimitingInterface[reconcile.Request]
	}{
		// Each shut down when the benchmark ends, and its workers with it.
		{"aging", func(b *testing.B) workqueue.TypedRateLimitingInterface[reconcile.Request] {
			q, _ := newTestQueue(b, LowPriorityWait)
			return q
		}},
		{"workqueue", func(b *testing.B) workqueue.TypedRateLimitingInterface[reconcile.Request] {
			q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request](),
				workqueue.TypedRateLimitingQueueConfig[reconcile.Request]{Name: b.Name()})
			b.Cleanup(q.ShutDown)
			return q
		}},
	}
	for _, qc := range queues {
		for _, apart := range []time.Duration{0, 10 * time.Millisecond} {
			b.Run(fmt.Sprintf("%s/apart=%s", qc.name, apart), func(b *testing.B) {
				q := qc.new(b)
				done := make(chan struct{})
				for range benchWorkers {
					go func() {
						for {
							item, shutdown := q.Get()
							if shutdown {
								return
							}
							q.Forget(item)
							q.Done(item)
							done <- struct{}{}
						}
					}()
				}
				items := make([]reconcile.Request, 1000)
				for i := range items {
					items[i] = req(fmt.Sprint("student-", i))
				}
				spent := runstat.Take()
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					if apart > 0 {
						time.Sleep(apart)
					}
					q.Add(items[i%len(items)])
					<-done
				}
				b.StopTimer()
				runstat.Report(b, spent)
			})
		}
	}
}
