// Package kubeevents records Kubernetes Events (events.k8s.io/v1) on a
// budget, so that recording them never blocks or slows publishing.
//
// client-go's recorder writes every Event from a goroutine of its own, with
// no bound on how many are in flight: under load the Events compete with the
// bridge's finalizer and status writes for the API server. This Recorder
// queues Events (Eventf never blocks), writes them from a few writers at no
// more than a set rate and only while the caller has no backlog, and drops,
// and counts, the oldest when the queue is full. Kubernetes Events are best
// effort in Kubernetes itself; the CloudEvent and the Student's status are
// what the bridge guarantees.
package kubeevents

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/reference"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Defaults of Options.
const (
	DefaultQueueSize = 1000
	DefaultWriters   = 4
	// maxNoteBytes is the API server's limit on an Event's note.
	maxNoteBytes = 1024
)

// Options configure a Recorder.
type Options struct {
	// Controller is the Events' reportingController.
	Controller string
	// Instance is their reportingInstance; Controller-hostname when empty.
	Instance string
	// QPS is the most Events written per second (burst: the same number,
	// at least 1). Must be positive.
	QPS float64
	// QueueSize bounds the Events waiting to be written; DefaultQueueSize
	// when zero.
	QueueSize int
	// Writers is how many Events may be in flight to the API server at
	// once; DefaultWriters when zero.
	Writers int
	// Log receives, at most once a minute each, drops and write failures.
	Log logr.Logger
	// Busy, if set, says the caller's own API writes have a backlog: Events
	// then wait (and, once the queue is full, are dropped) so that they
	// never take API server capacity the caller needs.
	Busy func() bool
	// Waited, if set, is told how long each Event written waited from
	// Eventf to its write's success.
	Waited func(time.Duration)
}

// Recorder implements client-go's events.EventRecorder. Start it (it is a
// controller-runtime Runnable) to have its Events written.
type Recorder struct {
	client  client.Client
	scheme  *runtime.Scheme
	opts    Options
	queue   chan *eventsv1.Event
	limiter *rate.Limiter
	now     func() time.Time

	mu      sync.Mutex
	lastLog map[string]time.Time // by message: logged at most once a minute
}

var (
	recorded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "student_bridge_kubernetes_events_total",
		Help: "Kubernetes Events the bridge recorded, by result: written, failed (the API server refused it), dropped (the oldest of a full queue, to make room).",
	}, []string{"result"})
	queued = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "student_bridge_kubernetes_events_queued",
		Help: "Kubernetes Events waiting to be written.",
	})
)

var registerOnce sync.Once

// RegisterMetrics registers the Kubernetes Event recorder's metrics with
// controller-runtime's registry, the one the bridge's manager serves; once
// per process.
func RegisterMetrics() {
	registerOnce.Do(func() {
		metrics.Registry.MustRegister(recorded, queued)
		for _, result := range []string{"written", "failed", "dropped"} {
			recorded.WithLabelValues(result) // exported from the start, at 0
		}
	})
}

// New returns a Recorder writing Events with c; scheme resolves the kinds of
// the objects they regard.
func New(c client.Client, scheme *runtime.Scheme, opts Options) (*Recorder, error) {
	if opts.QPS <= 0 {
		return nil, fmt.Errorf("kubeevents: QPS must be positive, got %v", opts.QPS)
	}
	if opts.QueueSize <= 0 {
		opts.QueueSize = DefaultQueueSize
	}
	if opts.Writers <= 0 {
		opts.Writers = DefaultWriters
	}
	if opts.Instance == "" {
		host, _ := os.Hostname()
		opts.Instance = opts.Controller + "-" + host
	}
	return &Recorder{
		client:  c,
		scheme:  scheme,
		opts:    opts,
		queue:   make(chan *eventsv1.Event, opts.QueueSize),
		limiter: rate.NewLimiter(rate.Limit(opts.QPS), max(1, int(opts.QPS))),
		now:     time.Now,
		lastLog: map[string]time.Time{},
	}, nil
}

// SetQPS changes the most Events written per second (and the burst with
// it), e.g. to this replica's share of a budget for all replicas.
func (r *Recorder) SetQPS(qps float64) {
	r.limiter.SetLimit(rate.Limit(qps))
	r.limiter.SetBurst(max(1, int(qps)))
}

// Eventf queues an Event regarding an object (and optionally related to
// another). It never blocks: when the queue is full, its oldest Event is
// dropped (and counted) to make room, so that the Events written under a
// load beyond the budget are the newest, not ones about changes long past.
func (r *Recorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	ev, err := r.build(regarding, related, eventtype, reason, action, fmt.Sprintf(note, args...))
	if err != nil {
		recorded.WithLabelValues("failed").Inc()
		r.opts.Log.Error(err, "cannot build Kubernetes Event", "reason", reason)
		return
	}
	for {
		select {
		case r.queue <- ev:
			queued.Inc()
			return
		default:
		}
		select {
		case <-r.queue:
			queued.Dec()
			recorded.WithLabelValues("dropped").Inc()
			r.logLimited("Kubernetes Events queue is full; dropping the oldest Events (see student_bridge_kubernetes_events_total{result=\"dropped\"})",
				"queueSize", r.opts.QueueSize, "qps", r.opts.QPS)
		default: // a writer took one meanwhile
		}
	}
}

func (r *Recorder) build(regarding, related runtime.Object, eventtype, reason, action, note string) (*eventsv1.Event, error) {
	ref, err := reference.GetReference(r.scheme, regarding)
	if err != nil {
		return nil, err
	}
	var rel *corev1.ObjectReference
	if related != nil {
		if rel, err = reference.GetReference(r.scheme, related); err != nil {
			return nil, err
		}
	}
	if len(note) > maxNoteBytes {
		note = note[:maxNoteBytes-3] + "..."
	}
	now := r.now()
	ns := ref.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	return &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{
			// Unique per object and time, as client-go names them.
			Name:      fmt.Sprintf("%s.%x", ref.Name, now.UnixNano()),
			Namespace: ns,
		},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: r.opts.Controller,
		ReportingInstance:   r.opts.Instance,
		Action:              action,
		Reason:              reason,
		Regarding:           *ref,
		Related:             rel,
		Note:                note,
		Type:                eventtype,
	}, nil
}

// logLimited logs msg at most once a minute: drops and refusals come in
// floods.
func (r *Recorder) logLimited(msg string, kv ...any) {
	r.mu.Lock()
	now := r.now()
	due := now.Sub(r.lastLog[msg]) >= time.Minute
	if due {
		r.lastLog[msg] = now
	}
	r.mu.Unlock()
	if due {
		r.opts.Log.Info(msg, kv...)
	}
}

// Start writes queued Events until ctx is done; what is still queued then
// is dropped (the bridge is stopping).
func (r *Recorder) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	for range r.opts.Writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.write(ctx)
		}()
	}
	wg.Wait()
	return nil
}

func (r *Recorder) write(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-r.queue:
			queued.Dec()
			if !r.waitIdle(ctx) {
				return
			}
			if err := r.limiter.Wait(ctx); err != nil {
				return
			}
			// A write outlives a cancelled context only briefly.
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			err := r.client.Create(wctx, ev)
			cancel()
			if err != nil {
				recorded.WithLabelValues("failed").Inc()
				r.logLimited("cannot write Kubernetes Event (see student_bridge_kubernetes_events_total{result=\"failed\"})",
					"event", ev.Name, "reason", ev.Reason, "error", err.Error())
				continue
			}
			recorded.WithLabelValues("written").Inc()
			if r.opts.Waited != nil {
				r.opts.Waited(r.now().Sub(ev.EventTime.Time))
			}
		}
	}
}

// waitIdle returns once Busy says the caller has no backlog, false if ctx
// ends first.
func (r *Recorder) waitIdle(ctx context.Context) bool {
	for r.opts.Busy != nil && r.opts.Busy() {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
	return ctx.Err() == nil
}

// NeedLeaderElection is false: every replica writes the Events it queued.
func (r *Recorder) NeedLeaderElection() bool { return false }
