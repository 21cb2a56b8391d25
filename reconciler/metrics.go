package reconciler

import (
	"context"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/student-bridge/student-bridge/sink"
)

// Publish results, the "result" label of the published-events counter.
const (
	resultSuccess   = "success"
	resultDuplicate = "duplicate"
	resultError     = "error"
)

var (
	eventsPublished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "student_bridge_events_published_total",
		Help: "CloudEvents the bridge tried to publish, by CloudEvent type and result (success, duplicate: the stream already had the id, error).",
	}, []string{"type", "result"})

	publishLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "student_bridge_publish_duration_seconds",
		Help:    "Time from the start of a publish to the broker's acknowledgement (or failure), by CloudEvent type.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}, []string{"type"})
)

func init() {
	metrics.Registry.MustRegister(eventsPublished, publishLatency)
}

// send publishes ev on s and records its latency and result in the metrics;
// every publish of the package goes through it.
func send(ctx context.Context, s sink.Sink, ev cloudevents.Event) (sink.Receipt, error) {
	start := time.Now()
	receipt, err := s.Publish(ctx, ev)
	publishLatency.WithLabelValues(ev.Type()).Observe(time.Since(start).Seconds())
	result := resultSuccess
	switch {
	case err != nil:
		result = resultError
	case receipt.Duplicate:
		result = resultDuplicate
	}
	eventsPublished.WithLabelValues(ev.Type(), result).Inc()
	return receipt, err
}
