package natssink

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// What a request to JetStream did, the label of jetstreamRequests.
const (
	requestPublish = "publish" // an event, waiting for its ack
	requestCommit  = "commit"  // an event with its record, one atomic batch
	requestWrite   = "write"   // a record written (compare-and-set)
	requestDelete  = "delete"  // a record removed (compare-and-set)
	requestRead    = "read"    // one record read from the stream's leader
	requestLoad    = "load"    // every record read, at a start or a shard's gain
	requestWatch   = "watch"   // a watch of a bucket started
	requestPurge   = "purge"   // delete markers purged
	requestLookup  = "lookup"  // which stream captures a subject no stream answered on
)

// jetstreamRequests counts what the bridge asks of JetStream, each request
// once however many messages it takes (a load reads many), so that what a
// change costs can be counted: NATS's own per-connection counts (connz)
// say how many messages, not what for.
var jetstreamRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "student_bridge_jetstream_requests_total",
	Help: "Requests the bridge made to JetStream, by request: publish (an event), commit (an event with its record), write and delete (a record), read (one record), load (every record), watch, purge, lookup (which stream captures a subject no stream answered on).",
}, []string{"request"})

var registerOnce sync.Once

// RegisterMetrics registers the JetStream request counts with reg (the
// bridge passes controller-runtime's registry), once per process, every
// series at 0. The package takes the registry rather than importing
// controller-runtime's, so that what imports it (services, the fuzzer)
// does not link client-go.
func RegisterMetrics(reg prometheus.Registerer) {
	registerOnce.Do(func() {
		reg.MustRegister(jetstreamRequests)
		for _, r := range []string{requestPublish, requestCommit, requestWrite, requestDelete, requestRead, requestLoad, requestWatch, requestPurge, requestLookup} {
			jetstreamRequests.WithLabelValues(r)
		}
	})
}

func count(request string) { jetstreamRequests.WithLabelValues(request).Inc() }
