// Package consumer is for business services that act on Students: a
// Mirror keeps the desired state of every Student from the bridge's
// JetStream stream and hands each change to the service, and a Reporter
// writes receipts (what the service applied) into the bucket the bridge
// reads to show, on each Student, which services are in sync.
//
// It depends on api/v1, nats.go and the CloudEvents SDK only.
//
// It is part of the module's public API, with api/v1 and api/contract:
// what it exports stays compatible from one release to the next, and make
// test compares it with the last release's (internal/publicapi).
package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// Desired is the desired state of one Student, as an event carried it.
type Desired struct {
	// Cluster is the cluster the event's source names.
	Cluster    string
	UID        string
	Namespace  string
	Name       string
	Generation int64
	Spec       studentv1.StudentSpec
	Labels     map[string]string
	// EventID and EventType name the event that carried this state;
	// Sequence is its stream sequence.
	EventID   string
	EventType string
	Sequence  uint64
	// StudentSequence is the event's place among the Student's own events
	// (its CloudEvent sequence attribute): 0 when it carries none.
	StudentSequence int64
}

// Change is what the handler applies for one Student: from Old, what it
// last applied (nil: nothing, the Student is new to the service), to New
// (nil: the Student was deleted). Changes that happened while the service
// was behind (stopped, or retrying this Student) come as one change to the
// newest state, as the bridge itself coalesces changes.
type Change struct {
	Old *Desired
	New *Desired
	// Cluster, UID, Namespace and Name identify the Student, whether
	// Old, New or both are set (they are New's, or Old's for a delete).
	// EventID, EventType and Generation name the newest event behind the
	// change: New's, or for a delete the deleted event's, which neither
	// Old nor New carries.
	Cluster    string
	UID        string
	Namespace  string
	Name       string
	EventID    string
	EventType  string
	Generation int64
	// TraceParent is the W3C trace context the newest event carried (its
	// traceparent attribute), empty without one. The handler's context
	// carries the span of this change, a child of it.
	TraceParent string
}

// Handler applies one change. It returns nil once the change is applied;
// an error is reported as failed and the change is retried with backoff,
// holding back only this Student. A change may be handed over again after
// a restart (at least once): a handler must be idempotent. Handlers of
// different Students run at once (MirrorOptions.Concurrency); one
// Student's changes are handed over one at a time, in order.
type Handler func(ctx context.Context, c Change) error

// MirrorOptions configure a Mirror.
type MirrorOptions struct {
	// Service names the service: its durable consumer and its receipts.
	Service string
	// Handler applies each change.
	Handler Handler
	// Stream is the bridge's stream; default STUDENTS (STUDENTS_FLEET
	// with Fleet).
	Stream string
	// Subjects filters the stream; default student.> (every event; on a
	// hub, student.east.> is cluster east's).
	Subjects string
	// ReceiptsBucket is where receipts go; default STUDENT_BRIDGE_RECEIPTS
	// (STUDENT_FLEET_RECEIPTS with Fleet).
	ReceiptsBucket string
	// Fleet reads a hub's stream of many clusters (docs/fleet.md):
	// Students are told apart by cluster and uid, receipts are written
	// under the hub's keys (studentv1.FleetReceiptKey) to find their way
	// to each Student's cluster, and a snapshot is asked of every cluster
	// the stream sources (<SnapshotSubject>.<cluster>).
	Fleet bool
	// SnapshotSubject is the bridge's snapshot request subject, default
	// student-bridge.snapshot; NoSnapshots never asks. When events the service
	// has not seen have left the stream (its limits, e.g. maxAge), the
	// rebuild asks the bridge for a snapshot of every Student first.
	SnapshotSubject string
	// SnapshotTimeout bounds the wait for the snapshot; default 1m.
	SnapshotTimeout time.Duration
	// RetryBaseDelay is the first wait before a failed change is retried
	// (doubling up to RetryMaxDelay); defaults 500ms and 30s.
	RetryBaseDelay time.Duration
	RetryMaxDelay  time.Duration
	// Concurrency is how many Students' changes are handled at once: a
	// slow or failing Student holds back only itself while others are
	// applied. Each Student's changes still go to the handler one at a
	// time, in stream order (newer ones coalesced while one runs).
	// Default 16; 1 handles one change at a time.
	Concurrency int
	// MaxAckPending bounds the events delivered but not yet acknowledged;
	// a Student that keeps failing holds back the acknowledgement (not the
	// handling) of later events. Default 10000.
	MaxAckPending int
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// defaultConcurrency is MirrorOptions.Concurrency's default.
const defaultConcurrency = 16

// NoSnapshots is the MirrorOptions.SnapshotSubject that makes the Mirror never
// ask the bridge for a snapshot.
const NoSnapshots = "none"

// Mirror keeps a service in step with the desired state of every Student.
// On start it rebuilds: the desired state up to where the service's
// durable consumer stopped, then one change per Student that changed since
// (for a new service: every current Student; deleted ones dropped). Then it
// applies every change, deduplicated by event id, each Student's in stream
// order and different Students' at once (MirrorOptions.Concurrency), and
// reports each outcome as a receipt.
type Mirror struct {
	o   MirrorOptions
	nc  *nats.Conn
	js  jetstream.JetStream
	rep *Reporter
	log *slog.Logger

	mu      sync.Mutex
	applied map[string]*Desired // by key: what the handler applied

	runs atomic.Int32 // Runs in progress: at most one
	gaps atomic.Int64

	// *runState is the current Run's state, made anew by each Run.
	*runState
}

// runState is what one Run keeps, owned by its loop: each Run starts
// from a new one, so nothing of a Run that ended leaks into the next.
type runState struct {
	pending   map[string]*pendingStudent
	held      []*heldMsg
	catchUp   int // rebuild Students not yet applied
	retries   chan string
	lastStart uint64   // the stream's last sequence when Run started
	ready     []string // Students whose change waits for a handler
	running   int      // handlers running
	outcomes  chan outcome
	handlers  sync.WaitGroup
	// numbers is the Student sequence of the newest event read per key.
	numbers map[string]int64
}

func newRunState() *runState {
	return &runState{
		pending:  map[string]*pendingStudent{},
		numbers:  map[string]int64{},
		retries:  make(chan string, retryQueueSize),
		outcomes: make(chan outcome),
	}
}

type pendingStudent struct {
	change   Change
	latest   *Desired // nil for a delete
	seq      uint64   // stream sequence of the newest event
	seqs     []uint64
	catchUp  bool
	attempts int
	waiting  bool // a retry is scheduled
	ready    bool // in Mirror.ready
	running  bool // its handler runs
}

type heldMsg struct {
	seq  uint64
	msg  jetstream.Msg
	done bool
}

// retryQueueSize is how many Students' retries, due at once, wait for
// Run's loop before their timers wait to hand them over.
const retryQueueSize = 64

// NewMirror returns a Mirror on nc; Run runs it.
func NewMirror(nc *nats.Conn, o MirrorOptions) (*Mirror, error) {
	if !studentv1.ValidServiceName(o.Service) {
		return nil, fmt.Errorf("consumer: service name %q: use letters, digits, '-' and '_' (up to 63)", o.Service)
	}
	if o.Handler == nil {
		return nil, errors.New("consumer: a Handler is required")
	}
	if o.Fleet {
		o.Stream = cmp.Or(o.Stream, studentv1.FleetStream)
		o.ReceiptsBucket = cmp.Or(o.ReceiptsBucket, studentv1.FleetReceiptsBucket)
	}
	o.Stream = cmp.Or(o.Stream, studentv1.DefaultStream)
	o.Subjects = cmp.Or(o.Subjects, studentv1.DefaultSubjects)
	o.ReceiptsBucket = cmp.Or(o.ReceiptsBucket, studentv1.ReceiptsBucket)
	o.SnapshotSubject = cmp.Or(o.SnapshotSubject, studentv1.DefaultSnapshotSubject)
	o.SnapshotTimeout = cmp.Or(o.SnapshotTimeout, time.Minute)
	o.RetryBaseDelay = cmp.Or(o.RetryBaseDelay, 500*time.Millisecond)
	o.RetryMaxDelay = cmp.Or(o.RetryMaxDelay, 30*time.Second)
	o.MaxAckPending = cmp.Or(o.MaxAckPending, 10000)
	if o.Concurrency < 0 {
		return nil, fmt.Errorf("consumer: Concurrency %d: use 1 or more (0: the default, %d)", o.Concurrency, defaultConcurrency)
	}
	o.Concurrency = cmp.Or(o.Concurrency, defaultConcurrency)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return &Mirror{o: o, nc: nc, js: js, log: o.Logger.With("service", o.Service), applied: map[string]*Desired{}}, nil
}

// State returns the desired state the handler has applied, by uid (with
// Fleet, by Key: cluster and uid).
func (m *Mirror) State() map[string]Desired {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]Desired, len(m.applied))
	for k, d := range m.applied {
		out[k] = *d
	}
	return out
}

// Key is how a Mirror with Fleet tells a Student apart: its cluster and
// uid (uids are unique within a cluster, and a cluster restored from
// another's backup keeps them).
func Key(cluster, uid string) string { return cluster + "/" + uid }

// key is the Student's key in the Mirror's maps: its uid, or with Fleet
// its Key.
func (m *Mirror) key(cluster, uid string) string {
	if m.o.Fleet {
		return Key(cluster, uid)
	}
	return uid
}

// Gaps counts the events the Mirror found missing: a Student's event
// whose sequence skips a number after the one read before it. The event
// that shows the gap carries the Student's whole desired state and is
// handed over as usual; what went missing is a state in between, lost to
// the stream (its limits, a purge, a message deleted by hand) or never
// delivered (a subject filter narrower than every event type).
func (m *Mirror) Gaps() int64 { return m.gaps.Load() }

// Run rebuilds, then applies changes until ctx is done (it then returns
// nil) or the stream cannot be read: its durable consumer was deleted, or
// the connection closed. A node of a NATS cluster going away does not end
// it: the rebuild reads on through a new consumer, and the live reading
// asks again after missed heartbeats. It returns once no handler runs.
// One Mirror runs once at a time: a second Run while one runs fails.
func (m *Mirror) Run(ctx context.Context) error {
	if !m.runs.CompareAndSwap(0, 1) {
		return errors.New("consumer: this Mirror is running already")
	}
	defer m.runs.Store(0)
	m.runState = newRunState()
	ctx, cancel := context.WithCancel(ctx)
	defer m.handlers.Wait()
	defer cancel()
	stream, cons, err := m.start(ctx)
	if err != nil {
		return err
	}
	if err := m.rebuild(ctx, stream, cons); err != nil {
		return err
	}
	return m.live(ctx, cons)
}

// start opens the stream, the receipts bucket and the service's durable
// consumer (made the first time).
func (m *Mirror) start(ctx context.Context) (jetstream.Stream, jetstream.Consumer, error) {
	stream, err := m.js.Stream(ctx, m.o.Stream)
	if err != nil {
		return nil, nil, fmt.Errorf("consumer: stream %s: %w", m.o.Stream, err)
	}
	if m.rep, err = NewReporter(ctx, m.nc, m.o.Service, m.o.ReceiptsBucket); err != nil {
		return nil, nil, err
	}
	cons, err := stream.Consumer(ctx, m.o.Service)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		cons, err = stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
			Durable:       m.o.Service,
			Description:   "student-bridge consumer.Mirror of service " + m.o.Service,
			FilterSubject: m.o.Subjects,
			DeliverPolicy: jetstream.DeliverAllPolicy,
			AckPolicy:     jetstream.AckAllPolicy,
			AckWait:       time.Minute,
			MaxAckPending: m.o.MaxAckPending,
		})
	}
	if err != nil {
		return nil, nil, fmt.Errorf("consumer: durable consumer %s: %w", m.o.Service, err)
	}
	return stream, cons, nil
}

// rebuild reads the stream once: the desired state the service applied up
// to its durable consumer's acknowledged position, then one change per
// Student that changed after it, each scheduled for the handler. When
// events the service has not seen left the stream, it first asks the
// bridge for a snapshot.
func (m *Mirror) rebuild(ctx context.Context, stream jetstream.Stream, cons jetstream.Consumer) error {
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("consumer: durable consumer %s: %w", m.o.Service, err)
	}
	sinfo, err := stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("consumer: stream %s: %w", m.o.Stream, err)
	}
	floor, last := info.AckFloor.Stream, sinfo.State.LastSeq
	// A consumer that never delivered anything is a new service's (or one
	// whose first rebuild did not finish): the server starts it at the
	// first event the stream still holds.
	fresh := info.Delivered.Consumer == 0
	if sinfo.State.Msgs > 0 && (sinfo.State.FirstSeq > floor+1 || (fresh && sinfo.State.FirstSeq > 1)) && m.o.SnapshotSubject != NoSnapshots {
		// Events the service has not seen have left the stream: a Student
		// whose last event went with them would stay unknown. The bridge's
		// snapshot puts the current state of every Student into the
		// stream, after which the rebuild finds them all.
		if last, err = m.snapshot(ctx, stream, sinfo.State.FirstSeq); err != nil {
			return err
		}
	}
	m.lastStart = last

	applied := map[string]*Desired{}
	if err := m.fold(ctx, stream, last, func(d *Desired, ev *event) {
		m.track(d)
		switch k := m.key(d.Cluster, d.UID); {
		case d.Sequence > floor:
			m.enqueue(d, ev, 0, true)
		case d.EventType == studentv1.EventTypeDeleted:
			delete(applied, k)
		default:
			applied[k] = d
		}
	}); err != nil {
		return err
	}
	m.mu.Lock()
	m.applied = applied
	m.mu.Unlock()
	m.log.Info("rebuilt the desired state", "applied", len(applied), "changed", len(m.pending), "fromSequence", floor+1, "toSequence", last)
	for _, k := range m.pendingInOrder() {
		m.schedule(ctx, k)
	}
	return nil
}

// live applies each change the durable consumer delivers, the retries and
// the handlers' outcomes, until ctx is done or the reading ends.
func (m *Mirror) live(ctx context.Context, cons jetstream.Consumer) error {
	var ended error
	msgs, stop, err := m.deliveries(ctx, cons, &ended)
	if err != nil {
		return err
	}
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case k := <-m.retries:
			if p := m.pending[k]; p != nil {
				p.waiting = false
				m.schedule(ctx, k)
			}
		case o := <-m.outcomes:
			m.finish(ctx, o)
		case d, ok := <-msgs:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				if ended == nil {
					ended = fmt.Errorf("consumer: reading %s stopped", m.o.Service)
				}
				return ended
			}
			m.receive(ctx, d)
		}
	}
}
