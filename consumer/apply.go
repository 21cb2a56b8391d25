package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// delivery is one message of the durable consumer, decoded.
type delivery struct {
	msg jetstream.Msg
	seq uint64
	ev  *event
	err error
}

// deliveries reads the durable consumer in a goroutine of its own. The
// channel closes when the reading ends; its error is then in *ended.
//
// Missed heartbeats do not end it: on a cluster, the consumer's leader
// moving to another node (a node restarting) leaves the pull request
// unanswered until the iterator asks again, which it does. Only a
// consumer that is gone (deleted by hand) ends the reading.
func (m *Mirror) deliveries(ctx context.Context, cons jetstream.Consumer, ended *error) (<-chan delivery, func(), error) {
	it, err := cons.Messages(jetstream.PullHeartbeat(liveHeartbeat))
	if err != nil {
		return nil, nil, fmt.Errorf("consumer: read %s: %w", m.o.Service, err)
	}
	out := make(chan delivery, 256)
	go func() {
		defer close(out)
		for {
			msg, err := it.Next()
			if errors.Is(err, jetstream.ErrNoHeartbeat) {
				if _, ierr := cons.Info(ctx); !errors.Is(ierr, jetstream.ErrConsumerNotFound) {
					m.log.Warn("the durable consumer missed its heartbeats; asking again", "consumer", m.o.Service)
					continue
				}
				err = jetstream.ErrConsumerDeleted
			}
			if errors.Is(err, jetstream.ErrConsumerDeleted) {
				*ended = fmt.Errorf("consumer: durable consumer %s is gone (deleted?); a new Run makes it again", m.o.Service)
				return
			}
			if err != nil {
				*ended = fmt.Errorf("consumer: read %s: %w", m.o.Service, err)
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

// liveHeartbeat is how often the server says the durable consumer is
// alive while the Mirror waits for events; two missed: ask again.
const liveHeartbeat = 5 * time.Second

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
	k := m.key(des.Cluster, des.UID)
	if p := m.pending[k]; p != nil && p.attempts == 0 {
		// A Student whose change failed waits for its retry, which takes
		// its newest change; one whose handler runs gets the newest once
		// it returns.
		m.schedule(ctx, k)
	}
	m.ack()
}

// enqueue adds an event to its Student's pending change, coalescing it
// with what is pending already.
func (m *Mirror) enqueue(d *Desired, ev *event, seq uint64, catchUp bool) {
	k := m.key(d.Cluster, d.UID)
	p := m.pending[k]
	if p == nil {
		p = &pendingStudent{catchUp: catchUp}
		m.pending[k] = p
		if catchUp {
			m.catchUp++
		}
	}
	if seq > 0 {
		p.seqs = append(p.seqs, seq)
	}
	p.change = Change{Cluster: d.Cluster, UID: d.UID, Namespace: d.Namespace, Name: d.Name, EventID: ev.id, EventType: ev.typ, Generation: d.Generation, TraceParent: ev.traceparent}
	p.latest, p.seq = d, d.Sequence
	if ev.typ == studentv1.EventTypeDeleted {
		p.latest = nil
	}
}

// pendingInOrder lists the keys of the pending Students by the sequence
// of their newest event.
func (m *Mirror) pendingInOrder() []string {
	keys := slices.Collect(maps.Keys(m.pending))
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Compare(m.pending[a].seq, m.pending[b].seq)
	})
	return keys
}

// schedule makes the pending change of the Student of key ready to be
// handled: at once when fewer than Concurrency handlers run, else when
// one returns, in the order Students became ready. A Student whose handler
// runs, or whose retry is scheduled, is not made ready again: its events
// are handled one at a time, in order.
func (m *Mirror) schedule(ctx context.Context, key string) {
	p := m.pending[key]
	if p == nil || p.running || p.waiting || p.ready {
		return
	}
	p.ready = true
	m.ready = append(m.ready, key)
	m.startReady(ctx)
}

// job is one handing over of a Student's pending change to the handler.
type job struct {
	key    string
	change Change
	// seqs is how many of the Student's pending stream sequences (a
	// prefix) the change covers, seq the newest.
	seqs int
	seq  uint64
	// checkReceipt: a rebuild's change is first looked up among the
	// receipts (applied before a restart).
	checkReceipt bool
}

// outcome is a job's result: the state the service now has (nil:
// deleted), or the error the change failed with.
type outcome struct {
	job   job
	state *Desired
	err   error
}

// startReady starts handlers for ready Students while fewer than
// Concurrency run. Each runs in a goroutine of its own and sends its
// outcome to m.outcomes, which Run's loop takes (finish).
func (m *Mirror) startReady(ctx context.Context) {
	for m.running < m.o.Concurrency && len(m.ready) > 0 {
		key := m.ready[0]
		m.ready = m.ready[1:]
		p := m.pending[key]
		if p == nil || !p.ready {
			continue
		}
		p.ready, p.running = false, true
		m.running++
		m.mu.Lock()
		old := m.applied[key]
		m.mu.Unlock()
		j := job{key: key, change: p.change, seqs: len(p.seqs), seq: p.seq, checkReceipt: p.catchUp && p.attempts == 0}
		j.change.Old, j.change.New = old, p.latest
		m.handlers.Add(1)
		outcomes := m.outcomes // this Run's, whenever the handler returns
		go func() {
			defer m.handlers.Done()
			state, err := m.apply(ctx, j)
			select {
			case outcomes <- outcome{job: j, state: state, err: err}:
			case <-ctx.Done():
			}
		}()
	}
}

// apply hands one change to the handler and reports it: skipped when
// already applied (the same event id, or reported applied before a
// restart). It runs beside other Students' apply, never beside its own
// Student's.
func (m *Mirror) apply(ctx context.Context, j job) (*Desired, error) {
	c := j.change
	cluster, uid := m.receiptCluster(c), c.UID
	switch {
	case c.New == nil && c.Old == nil:
		// Deleted before the service applied it: nothing to undo.
		_ = m.rep.ForgetIn(ctx, cluster, uid)
		return nil, nil
	case c.New != nil && c.Old != nil && (c.Old.EventID == c.New.EventID || sameState(c.Old, c.New)):
		// The same event, or one with the same state (a snapshot of a
		// Student that did not change): nothing to apply.
		return c.New, nil
	case j.checkReceipt && c.New != nil:
		if id, err := m.rep.AppliedIn(ctx, cluster, uid); err == nil && id == c.New.EventID {
			return c.New, nil // applied and reported before a restart
		}
	}
	hctx, span := m.startApply(ctx, c)
	err := m.o.Handler(hctx, c)
	traceID := ""
	if sc := span.SpanContext(); sc.HasTraceID() {
		traceID = sc.TraceID().String()
	}
	endApply(span, err)
	if err != nil {
		if c.New != nil {
			if rerr := m.rep.Report(ctx, receipt(c, cluster, studentv1.ResultFailed, err.Error(), traceID)); rerr != nil {
				m.log.Warn("writing a failed receipt failed", "student", c.Namespace+"/"+c.Name, "reason", rerr.Error())
			}
		}
		return nil, err
	}
	if c.New == nil {
		err = m.rep.ForgetIn(ctx, cluster, uid)
	} else {
		err = m.rep.Report(ctx, receipt(c, cluster, studentv1.ResultApplied, "", traceID))
	}
	if err != nil {
		return nil, fmt.Errorf("applied, but the receipt was not written: %w", err)
	}
	return c.New, nil
}

func sameState(a, b *Desired) bool {
	return a.Generation == b.Generation && a.Spec == b.Spec && maps.Equal(a.Labels, b.Labels)
}

// finish takes a handler's outcome in Run's loop: on success the change
// is settled and, if newer events of the Student came meanwhile, their
// change is made ready; a failure is retried with backoff. Either way the
// freed handler slot goes to the next ready Student.
func (m *Mirror) finish(ctx context.Context, o outcome) {
	m.running--
	p := m.pending[o.job.key]
	p.running = false
	if o.err == nil {
		m.settle(o.job, o.state)
		m.schedule(ctx, o.job.key) // newer events that came meanwhile
	} else {
		c := o.job.change
		p.attempts++
		delay := min(m.o.RetryBaseDelay<<min(p.attempts-1, 20), m.o.RetryMaxDelay)
		m.log.Info("change failed; retrying", "student", c.Namespace+"/"+c.Name, "event", c.EventID, "attempt", p.attempts, "retryIn", delay.String(), "reason", o.err.Error())
		p.waiting = true
		key, retries := o.job.key, m.retries // this Run's, whenever the timer fires
		time.AfterFunc(delay, func() {
			select {
			case retries <- key:
			case <-ctx.Done():
			}
		})
	}
	m.startReady(ctx)
}

// settle records the change of j as applied (newState nil: deleted) and
// lets its events be acknowledged. A Student with newer events than j
// handed over stays pending.
func (m *Mirror) settle(j job, newState *Desired) {
	m.mu.Lock()
	if newState == nil {
		delete(m.applied, j.key)
	} else {
		m.applied[j.key] = newState
	}
	m.mu.Unlock()
	p := m.pending[j.key]
	done := p.seqs[:j.seqs]
	for _, h := range m.held {
		if slices.Contains(done, h.seq) {
			h.done = true
		}
	}
	if p.catchUp {
		m.catchUp--
		p.catchUp = false
	}
	if p.seq == j.seq {
		delete(m.pending, j.key)
	} else {
		p.seqs = slices.Delete(p.seqs, 0, j.seqs)
		p.attempts = 0
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

// receiptCluster is the cluster a receipt of c names: with Fleet, the
// Student's (its key in the hub's bucket); else none.
func (m *Mirror) receiptCluster(c Change) string {
	if m.o.Fleet {
		return c.Cluster
	}
	return ""
}

func receipt(c Change, cluster, result, message, traceID string) studentv1.Receipt {
	return studentv1.Receipt{Cluster: cluster, UID: c.UID, Namespace: c.Namespace, Name: c.Name, EventID: c.EventID, TraceID: traceID,
		Generation: c.Generation, Result: result, Message: message, Time: metav1.Now()}
}

// track checks d's place in its Student's sequence against the event read
// before it and counts a gap. A snapshot carries the number of the last
// change: one above what was read means that change was missed.
func (m *Mirror) track(d *Desired) {
	k := m.key(d.Cluster, d.UID)
	prev, seen := m.numbers[k]
	next := d.StudentSequence
	if next == 0 {
		return // no sequence: a snapshot of a Student with no event yet
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
		delete(m.numbers, k)
		return
	}
	if next > prev {
		m.numbers[k] = next
	}
}
