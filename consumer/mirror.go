// Package consumer is for business services that act on Students: a
// Mirror keeps the desired state of every Student from the bridge's
// JetStream stream and hands each change to the service, and a Reporter
// writes receipts (what the service applied) into the bucket the bridge
// reads to show, on each Student, which services are in sync.
//
// It depends on api/v1, nats.go and the CloudEvents SDK only.
package consumer

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	cejetstream "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// Desired is the desired state of one Student, as an event carried it.
type Desired struct {
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
	// UID, Namespace and Name identify the Student; EventID, EventType and
	// Generation the newest event behind the change (the deleted event's
	// when New is nil).
	UID        string
	Namespace  string
	Name       string
	EventID    string
	EventType  string
	Generation int64
}

// Handler applies one change. It returns nil once the change is applied;
// an error is reported as failed and the change is retried with backoff,
// holding back only this Student. A change may be handed over again after
// a restart (at least once): a handler must be idempotent.
type Handler func(ctx context.Context, c Change) error

// MirrorOptions configure a Mirror.
type MirrorOptions struct {
	// Service names the service: its durable consumer and its receipts.
	Service string
	// Handler applies each change.
	Handler Handler
	// Stream is the bridge's stream; default STUDENTS.
	Stream string
	// Subjects filters the stream; default student.> (every event).
	Subjects string
	// ReceiptsBucket is where receipts go; default STUDENT_BRIDGE_RECEIPTS.
	ReceiptsBucket string
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
	// MaxAckPending bounds the events delivered but not yet acknowledged;
	// a Student that keeps failing holds back the acknowledgement (not the
	// handling) of later events. Default 10000.
	MaxAckPending int
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// NoSnapshots, as MirrorOptions.SnapshotSubject, makes the Mirror never
// ask the bridge for a snapshot.
const NoSnapshots = "none"

// Mirror keeps a service in step with the desired state of every Student.
// On start it rebuilds: the desired state up to where the service's
// durable consumer stopped, then one change per Student that changed since
// (for a new service: every current Student; deleted ones dropped). Then it
// applies every change in stream order, deduplicated by event id, and
// reports each outcome as a receipt.
type Mirror struct {
	o   MirrorOptions
	nc  *nats.Conn
	js  jetstream.JetStream
	rep *Reporter
	log *slog.Logger

	mu      sync.Mutex
	applied map[string]*Desired // by uid: what the handler applied

	// Owned by Run's loop.
	pending   map[string]*pendingStudent
	held      []*heldMsg
	catchUp   int // rebuild Students not yet applied
	retries   chan string
	lastStart uint64 // the stream's last sequence when Run started
	// numbers is the Student sequence of the newest event read per uid.
	numbers map[string]int64
	gaps    atomic.Int64
}

type pendingStudent struct {
	change   Change
	latest   *Desired // nil for a delete
	seq      uint64   // stream sequence of the newest event
	seqs     []uint64
	catchUp  bool
	attempts int
	waiting  bool // a retry is scheduled
}

type heldMsg struct {
	seq  uint64
	msg  jetstream.Msg
	done bool
}

// NewMirror returns a Mirror on nc; Run runs it.
func NewMirror(nc *nats.Conn, o MirrorOptions) (*Mirror, error) {
	if !studentv1.ValidServiceName(o.Service) {
		return nil, fmt.Errorf("consumer: service name %q: use letters, digits, '-' and '_' (up to 63)", o.Service)
	}
	if o.Handler == nil {
		return nil, errors.New("consumer: a Handler is required")
	}
	o.Stream = cmp.Or(o.Stream, studentv1.DefaultStream)
	o.Subjects = cmp.Or(o.Subjects, studentv1.DefaultSubjects)
	o.ReceiptsBucket = cmp.Or(o.ReceiptsBucket, studentv1.ReceiptsBucket)
	o.SnapshotSubject = cmp.Or(o.SnapshotSubject, studentv1.DefaultSnapshotSubject)
	o.SnapshotTimeout = cmp.Or(o.SnapshotTimeout, time.Minute)
	o.RetryBaseDelay = cmp.Or(o.RetryBaseDelay, 500*time.Millisecond)
	o.RetryMaxDelay = cmp.Or(o.RetryMaxDelay, 30*time.Second)
	o.MaxAckPending = cmp.Or(o.MaxAckPending, 10000)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return &Mirror{o: o, nc: nc, js: js, log: o.Logger.With("service", o.Service), applied: map[string]*Desired{}}, nil
}

// State returns the desired state the handler has applied, by uid.
func (m *Mirror) State() map[string]Desired {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]Desired, len(m.applied))
	for uid, d := range m.applied {
		out[uid] = *d
	}
	return out
}

// Gaps counts the events the Mirror found missing: a Student's event
// whose sequence skips a number after the one read before it. The event
// that shows the gap carries the Student's whole desired state and is
// handed over as usual; what went missing is a state in between, lost to
// the stream (its limits, a purge, a message deleted by hand) or never
// delivered (a subject filter narrower than every event type).
func (m *Mirror) Gaps() int64 { return m.gaps.Load() }

// track checks d's place in its Student's sequence against the event read
// before it and counts a gap. A snapshot carries the number of the last
// change: one above what was read means that change was missed.
func (m *Mirror) track(d *Desired) {
	prev, seen := m.numbers[d.UID]
	next := d.StudentSequence
	if next == 0 {
		return // an event of a bridge that did not count yet
	}
	want := prev + 1
	if d.EventType == studentv1.EventTypeSnapshot {
		want = prev
	}
	if seen && prev > 0 && next > want {
		m.gaps.Add(1)
		m.log.Warn("a Student's sequence skips events; handing over its newest state", "student", d.Namespace+"/"+d.Name,
			"uid", d.UID, "after", prev, "got", next, "event", d.EventID, "streamSequence", d.Sequence)
	}
	if d.EventType == studentv1.EventTypeDeleted {
		delete(m.numbers, d.UID)
		return
	}
	if next > prev {
		m.numbers[d.UID] = next
	}
}

// Run rebuilds, then applies changes until ctx is done (it then returns
// nil) or the stream cannot be read.
func (m *Mirror) Run(ctx context.Context) error {
	stream, err := m.js.Stream(ctx, m.o.Stream)
	if err != nil {
		return fmt.Errorf("consumer: stream %s: %w", m.o.Stream, err)
	}
	if m.rep, err = NewReporter(ctx, m.js, m.o.Service, m.o.ReceiptsBucket); err != nil {
		return err
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
		return fmt.Errorf("consumer: durable consumer %s: %w", m.o.Service, err)
	}
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

	// One reading of the stream: what the service applied up to its
	// acknowledged position, then one change per Student that changed
	// after it.
	applied := map[string]*Desired{}
	m.pending = map[string]*pendingStudent{}
	m.numbers = map[string]int64{}
	m.retries = make(chan string, 64)
	if err := m.fold(ctx, stream, last, func(d *Desired, ev *event) {
		m.track(d)
		switch {
		case d.Sequence > floor:
			m.enqueue(d, ev, 0, true)
		case d.EventType == studentv1.EventTypeDeleted:
			delete(applied, d.UID)
		default:
			applied[d.UID] = d
		}
	}); err != nil {
		return err
	}
	m.mu.Lock()
	m.applied = applied
	m.mu.Unlock()
	m.log.Info("rebuilt the desired state", "applied", len(applied), "changed", len(m.pending), "fromSequence", floor+1, "toSequence", last)
	for _, uid := range m.pendingInOrder() {
		m.handle(ctx, uid)
	}

	msgs, stop, err := m.deliveries(ctx, cons)
	if err != nil {
		return err
	}
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case uid := <-m.retries:
			if p := m.pending[uid]; p != nil {
				p.waiting = false
				m.handle(ctx, uid)
			}
		case d, ok := <-msgs:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("consumer: reading %s stopped", m.o.Service)
			}
			m.receive(ctx, d)
		}
	}
}

// snapshot asks the bridge for a snapshot and returns the stream's last
// sequence once every snapshot event is in it.
func (m *Mirror) snapshot(ctx context.Context, stream jetstream.Stream, firstSeq uint64) (uint64, error) {
	body, _ := json.Marshal(studentv1.SnapshotRequest{})
	rctx, cancel := context.WithTimeout(ctx, m.o.SnapshotTimeout)
	defer cancel()
	msg, err := m.nc.RequestWithContext(rctx, m.o.SnapshotSubject, body)
	if err == nil {
		var reply studentv1.SnapshotReply
		if err = json.Unmarshal(msg.Data, &reply); err == nil && reply.Error != "" {
			err = errors.New(reply.Error)
		}
		if err == nil {
			m.log.Info("events the service has not seen left the stream; the bridge published a snapshot", "firstSequence", firstSeq, "snapshot", reply.Run, "students", reply.Published)
		}
	}
	if err != nil {
		return 0, fmt.Errorf("consumer: events from before sequence %d left the stream, and the snapshot request on %s failed (is the bridge running with snapshot requests?): %w", firstSeq, m.o.SnapshotSubject, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("consumer: stream %s: %w", m.o.Stream, err)
	}
	return info.State.LastSeq, nil
}

// delivery is one message of the durable consumer, decoded.
type delivery struct {
	msg jetstream.Msg
	seq uint64
	ev  *event
	err error
}

// deliveries reads the durable consumer in a goroutine of its own.
func (m *Mirror) deliveries(ctx context.Context, cons jetstream.Consumer) (<-chan delivery, func(), error) {
	it, err := cons.Messages()
	if err != nil {
		return nil, nil, fmt.Errorf("consumer: read %s: %w", m.o.Service, err)
	}
	out := make(chan delivery, 256)
	go func() {
		defer close(out)
		for {
			msg, err := it.Next()
			if err != nil {
				return
			}
			d := delivery{msg: msg}
			if md, err := msg.Metadata(); err == nil {
				d.seq = md.Sequence.Stream
			}
			d.ev, d.err = decode(msg)
			select {
			case out <- d:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, it.Stop, nil
}

// receive takes one live message.
func (m *Mirror) receive(ctx context.Context, d delivery) {
	if len(m.held) > 0 && d.seq <= m.held[len(m.held)-1].seq {
		return // redelivered while held here
	}
	h := &heldMsg{seq: d.seq, msg: d.msg}
	m.held = append(m.held, h)
	if d.seq <= m.lastStart {
		// Read and handled by the rebuild: acknowledged once it is
		// applied, so the next start rebuilds from here.
		h.done = true
		m.ack()
		return
	}
	if d.err != nil {
		m.log.Warn("skipping an event that is not a Student CloudEvent", "sequence", d.seq, "reason", d.err.Error())
		h.done = true
		m.ack()
		return
	}
	des := d.ev.desired(d.seq)
	m.track(des)
	m.enqueue(des, d.ev, d.seq, false)
	if p := m.pending[des.UID]; p != nil && !p.waiting && p.attempts == 0 {
		m.handle(ctx, des.UID)
	}
	m.ack()
}

// enqueue adds an event to its Student's pending change, coalescing it
// with what is pending already.
func (m *Mirror) enqueue(d *Desired, ev *event, seq uint64, catchUp bool) {
	p := m.pending[d.UID]
	if p == nil {
		p = &pendingStudent{catchUp: catchUp}
		m.pending[d.UID] = p
		if catchUp {
			m.catchUp++
		}
	}
	if seq > 0 {
		p.seqs = append(p.seqs, seq)
	}
	p.change = Change{UID: d.UID, Namespace: d.Namespace, Name: d.Name, EventID: ev.id, EventType: ev.typ, Generation: d.Generation}
	p.latest, p.seq = d, d.Sequence
	if ev.typ == studentv1.EventTypeDeleted {
		p.latest = nil
	}
}

// pendingInOrder lists the pending Students by the sequence of their
// newest event.
func (m *Mirror) pendingInOrder() []string {
	uids := slices.Collect(maps.Keys(m.pending))
	slices.SortFunc(uids, func(a, b string) int {
		return cmp.Compare(m.pending[a].seq, m.pending[b].seq)
	})
	return uids
}

// handle applies the pending change of uid: skipped when already applied
// (the same event id, or reported applied before a restart), else handed
// to the handler and reported; a failure is retried with backoff.
func (m *Mirror) handle(ctx context.Context, uid string) {
	p := m.pending[uid]
	m.mu.Lock()
	old := m.applied[uid]
	m.mu.Unlock()
	c := p.change
	c.Old, c.New = old, p.latest
	switch {
	case c.New == nil && old == nil:
		// Deleted before the service applied it: nothing to undo.
		_ = m.rep.Forget(ctx, uid)
		m.settle(uid, nil)
		return
	case c.New != nil && old != nil && (old.EventID == c.New.EventID || sameState(old, c.New)):
		// The same event, or one with the same state (a snapshot of a
		// Student that did not change): nothing to apply.
		m.settle(uid, c.New)
		return
	case p.catchUp && p.attempts == 0 && c.New != nil:
		if id, err := m.rep.Applied(ctx, uid); err == nil && id == c.New.EventID {
			m.settle(uid, c.New) // applied and reported before a restart
			return
		}
	}
	err := m.o.Handler(ctx, c)
	if err == nil {
		if c.New == nil {
			err = m.rep.Forget(ctx, uid)
		} else {
			err = m.rep.Report(ctx, receipt(c, studentv1.ResultApplied, ""))
		}
		if err != nil {
			err = fmt.Errorf("applied, but the receipt was not written: %w", err)
		}
	} else if c.New != nil {
		if rerr := m.rep.Report(ctx, receipt(c, studentv1.ResultFailed, err.Error())); rerr != nil {
			m.log.Warn("writing a failed receipt failed", "student", c.Namespace+"/"+c.Name, "reason", rerr.Error())
		}
	}
	if err == nil {
		m.settle(uid, c.New)
		return
	}
	p.attempts++
	delay := min(m.o.RetryBaseDelay<<min(p.attempts-1, 20), m.o.RetryMaxDelay)
	m.log.Info("change failed; retrying", "student", c.Namespace+"/"+c.Name, "event", c.EventID, "attempt", p.attempts, "retryIn", delay.String(), "reason", err.Error())
	p.waiting = true
	time.AfterFunc(delay, func() {
		select {
		case m.retries <- uid:
		case <-ctx.Done():
		}
	})
}

func sameState(a, b *Desired) bool {
	return a.Generation == b.Generation && a.Spec == b.Spec && maps.Equal(a.Labels, b.Labels)
}

// settle records uid's pending change as applied (newState nil: deleted)
// and lets its events be acknowledged.
func (m *Mirror) settle(uid string, newState *Desired) {
	m.mu.Lock()
	if newState == nil {
		delete(m.applied, uid)
	} else {
		m.applied[uid] = newState
	}
	m.mu.Unlock()
	p := m.pending[uid]
	delete(m.pending, uid)
	if p.catchUp {
		m.catchUp--
	}
	for _, h := range m.held {
		if slices.Contains(p.seqs, h.seq) {
			h.done = true
		}
	}
	m.ack()
}

// ack acknowledges (AckAll) the longest handled prefix of the held
// messages, once the rebuild is applied.
func (m *Mirror) ack() {
	if m.catchUp > 0 {
		return
	}
	n := 0
	for n < len(m.held) && m.held[n].done {
		n++
	}
	if n == 0 {
		return
	}
	if err := m.held[n-1].msg.Ack(); err != nil {
		m.log.Warn("acknowledging failed; the events will be handed over again", "sequence", m.held[n-1].seq, "reason", err.Error())
		return
	}
	m.held = m.held[n:]
}

func receipt(c Change, result, message string) studentv1.Receipt {
	return studentv1.Receipt{UID: c.UID, Namespace: c.Namespace, Name: c.Name, EventID: c.EventID,
		Generation: c.Generation, Result: result, Message: message, Time: metav1.Now()}
}

// rebuildConsumer names the consumer a service's Mirror reads the stream
// through while it rebuilds, next to its durable consumer (named service).
// Both names are the service's own ('~' is in no service name), so a NATS
// user can be limited to its own consumers; see deploy/nats.
func rebuildConsumer(service string) string { return service + "~rebuild" }

// fold reads the stream's events from its first up to sequence to, in
// order.
func (m *Mirror) fold(ctx context.Context, stream jetstream.Stream, to uint64, apply func(*Desired, *event)) error {
	if to == 0 {
		return nil
	}
	// Reading waits for a message: read only if there is one.
	_, err := stream.GetLastMsgForSubject(ctx, m.o.Subjects)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("consumer: read %s: %w", m.o.Stream, err)
	}
	// A consumer of the service's own name, made for this one reading and
	// deleted after it (a run that died left it behind: its position is
	// wrong, so it goes first; the server also drops it once idle).
	name := rebuildConsumer(m.o.Service)
	if err := stream.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("consumer: read %s: %w", m.o.Stream, err)
	}
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Name:              name,
		Description:       "student-bridge consumer.Mirror of service " + m.o.Service + ", rebuilding",
		FilterSubject:     m.o.Subjects,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: time.Minute,
		Replicas:          1,
		MemoryStorage:     true,
	})
	if err != nil {
		return fmt.Errorf("consumer: read %s: %w", m.o.Stream, err)
	}
	defer func() { _ = stream.DeleteConsumer(context.WithoutCancel(ctx), name) }()
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("consumer: read %s: %w", m.o.Stream, err)
	}
	defer it.Stop()
	var delivered uint64
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return fmt.Errorf("consumer: read %s: %w", m.o.Stream, err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return err
		}
		// Nothing acknowledges here, so nothing would redeliver a message
		// lost on the way: a gap in the consumer's count ends the rebuild
		// with an error rather than a state missing an event.
		if delivered++; md.Sequence.Consumer != delivered {
			return fmt.Errorf("consumer: read %s: message %d of the rebuild came as %d", m.o.Stream, delivered, md.Sequence.Consumer)
		}
		if md.Sequence.Stream > to {
			return nil
		}
		if ev, err := decode(msg); err != nil {
			m.log.Warn("skipping an event that is not a Student CloudEvent", "sequence", md.Sequence.Stream, "reason", err.Error())
		} else {
			apply(ev.desired(md.Sequence.Stream), ev)
		}
		if md.Sequence.Stream >= to || md.NumPending == 0 {
			return nil
		}
	}
}

// event is the part of a Student CloudEvent the mirror reads.
type event struct {
	id, typ string
	number  int64 // the Student sequence; 0: none
	data    studentv1.StudentEventData
}

func (e *event) desired(seq uint64) *Desired {
	md := e.data.Metadata
	return &Desired{UID: md.UID, Namespace: md.Namespace, Name: md.Name, Generation: md.Generation,
		Spec: e.data.Spec, Labels: md.Labels, EventID: e.id, EventType: e.typ, Sequence: seq, StudentSequence: e.number}
}

// decode reads a Student CloudEvent in either encoding of the NATS binding.
func decode(msg jetstream.Msg) (*event, error) {
	nm := &nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()}
	ce, err := binding.ToEvent(context.Background(), cejetstream.NewMessage(nm))
	if err != nil {
		return nil, err
	}
	ev := &event{id: ce.ID(), typ: ce.Type()}
	ev.number, _ = studentv1.ParseSequence(ce.Extensions()[studentv1.ExtensionSequence])
	if err := json.Unmarshal(ce.Data(), &ev.data); err != nil {
		return nil, fmt.Errorf("data of %s: %w", ev.id, err)
	}
	if ev.data.Metadata.UID == "" {
		return nil, fmt.Errorf("event %s names no Student uid", ev.id)
	}
	return ev, nil
}
