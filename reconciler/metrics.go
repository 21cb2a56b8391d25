package reconciler

import (
	"context"
	"errors"
	"sync"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/records"
	"github.com/student-bridge/student-bridge/internal/stages"
	"github.com/student-bridge/student-bridge/internal/statusview"
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

	publishErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "student_bridge_publish_errors_total",
		Help: "Publishes that failed, by reason: unavailable (the cluster cannot store now: an election, no quorum, a copy in flight), " +
			"not_connected, rejected (the broker refused: a full stream, no stream for the subject, permissions), too_large, closed, " +
			"conflict (the record store's record changed under a write: an earlier write that timed out and landed, or another writer), other. All are retried but too_large.",
	}, []string{"reason"})

	publishLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "student_bridge_publish_duration_seconds",
		Help:    "Time from the start of a publish to the broker's acknowledgement (or failure), by CloudEvent type.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}, []string{"type"})

	otherShardChanges = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "student_bridge_other_shard_changes_total",
		Help: "Changes of Students whose shard another replica holds, seen by the watch and dropped before the work queue (with shards). The cache keeps them for a handover.",
	})
)

var registerOnce sync.Once

// RegisterMetrics registers the reconciler's metrics with
// controller-runtime's registry, the one the manager serves; once per
// process, however many bridges it runs. Every series an alert or the
// dashboard reads is exported from then, at 0: a rate over a series that
// appears only with its first error would miss that error.
func RegisterMetrics() {
	records.RegisterMetrics()
	stages.RegisterMetrics()
	statusview.RegisterMetrics()
	registerOnce.Do(func() {
		metrics.Registry.MustRegister(eventsPublished, publishErrors, publishLatency,
			serviceStudents, otherShardChanges,
			catchUpPending, catchUpDuration, caughtUpAt, publishingSince)
		for _, typ := range []string{studentv1.EventTypeCreated, studentv1.EventTypeUpdated, studentv1.EventTypeDeleted, studentv1.EventTypeSnapshot} {
			for _, result := range []string{resultSuccess, resultDuplicate, resultError} {
				eventsPublished.WithLabelValues(typ, result)
			}
		}
		for _, r := range errorReasons {
			publishErrors.WithLabelValues(r.reason)
		}
	})
}

// errorReasons name the sink's errors in student_bridge_publish_errors_total;
// anything else is "other".
var errorReasons = []struct {
	err    error
	reason string
}{
	{sink.ErrUnavailable, "unavailable"},
	{sink.ErrNotConnected, "not_connected"},
	{sink.ErrRejected, "rejected"},
	{sink.ErrTooLarge, "too_large"},
	{sink.ErrClosed, "closed"},
	{sink.ErrConflict, "conflict"},
	{nil, "other"},
}

// ErrorReason is the reason label err is counted under.
func ErrorReason(err error) string {
	for _, r := range errorReasons {
		if r.err == nil || errors.Is(err, r.err) {
			return r.reason
		}
	}
	return "other"
}

// since observes the time since start in stage.
func since(stage string, start time.Time) {
	stages.Observe(stage, time.Since(start))
}

// send publishes ev on s and records its latency and result in the metrics;
// every publish of the package goes through it (or through measured).
// encoded, if not nil, is ev as JSON, which a sink that can takes as is.
func send(ctx context.Context, s sink.Sink, ev cloudevents.Event, encoded []byte) (sink.Receipt, error) {
	return measured(ev, func() (sink.Receipt, error) {
		if es, ok := s.(encodedSink); ok && encoded != nil {
			return es.PublishEncoded(ctx, ev, encoded)
		}
		return s.Publish(ctx, ev)
	})
}

// encodedSink is a sink that publishes an event the bridge has encoded
// already (its reservation holds the event as JSON) without encoding it
// again (natssink.Publisher).
type encodedSink interface {
	PublishEncoded(ctx context.Context, ev cloudevents.Event, encoded []byte) (sink.Receipt, error)
}

// measured runs publish, which sends ev, and records its latency and result
// in the metrics.
func measured(ev cloudevents.Event, publish func() (sink.Receipt, error)) (sink.Receipt, error) {
	start := time.Now()
	receipt, err := publish()
	took := time.Since(start)
	publishLatency.WithLabelValues(ev.Type()).Observe(took.Seconds())
	stages.Observe(stages.Publish, took)
	result := resultSuccess
	switch {
	case err != nil:
		result = resultError
		publishErrors.WithLabelValues(ErrorReason(err)).Inc()
	case receipt.Duplicate:
		result = resultDuplicate
	}
	eventsPublished.WithLabelValues(ev.Type(), result).Inc()
	return receipt, err
}
