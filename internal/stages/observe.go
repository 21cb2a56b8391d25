package stages

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The stages of a change's way through the bridge: the "stage" label of
// Metric.
const (
	Queue           = "queue"
	WriteAhead      = "write_ahead"
	Publish         = "publish"
	Record          = "record"
	Finalizer       = "finalizer"
	Status          = "status"
	KubernetesEvent = "kubernetes_event"
)

// All lists every stage, in the order a change goes through them.
var All = []string{Queue, WriteAhead, Publish, Record, Finalizer, Status, KubernetesEvent}

var latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name: Metric,
	Help: "Time a change spent in each stage of its way through the bridge: queue (watch event to reconcile start), " +
		"write_ahead (the pending record of a first event), publish (to JetStream's ack), record (the record's write after the ack), " +
		"finalizer (adding or removing it), status (asked for to written) and kubernetes_event (queued to written).",
	Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18),
}, []string{"stage"})

var registerOnce sync.Once

// RegisterMetrics registers Metric with controller-runtime's registry,
// once per process, every stage at 0.
func RegisterMetrics() {
	registerOnce.Do(func() {
		metrics.Registry.MustRegister(latency)
		for _, s := range All {
			latency.WithLabelValues(s)
		}
	})
}

// Observe records that a change spent d in stage.
func Observe(stage string, d time.Duration) {
	latency.WithLabelValues(stage).Observe(d.Seconds())
}
