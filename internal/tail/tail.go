// Package tail is the consumer side of student-bridge: it reads Student
// CloudEvents from the JetStream stream, replays history as configured, and
// prints each event as a readable line or as CloudEvent JSON.
package tail

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/consumer"
)

// Deliver policies: where in the stream reading starts.
const (
	DeliverNew      = "new"      // only events published from now on
	DeliverAll      = "all"      // the whole stream
	DeliverLast     = "last"     // the last event of every Student, then new ones
	DeliverSince    = "since"    // from Options.Since
	DeliverSequence = "sequence" // from Options.FromSequence
)

// Options configure Run.
type Options struct {
	Stream       string
	Subjects     []string
	Deliver      string
	Since        time.Time
	FromSequence uint64
	// Durable names a durable consumer that remembers what was printed.
	Durable string
	// Follow keeps waiting for new events; without it Run returns once the
	// stream has been read to its end.
	Follow bool
	// JSON prints one CloudEvent JSON object per line instead of text.
	JSON bool
	Out  io.Writer
}

// Run prints events until ctx is cancelled or, without Follow, the stream is
// read to its end.
func Run(ctx context.Context, nc *nats.Conn, o Options) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := openConsumer(ctx, js, o)
	if err != nil {
		return err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("consumer info: %w", err)
	}
	s := &session{o: o, p: printer{out: o.Out, json: o.JSON}, pending: info.NumPending}
	if o.Deliver == DeliverNew {
		s.pending = 0
	}
	s.r = &fetchReader{cons: cons}
	if o.Follow {
		iter, err := cons.Messages()
		if err != nil {
			return fmt.Errorf("read stream %s: %w", o.Stream, err)
		}
		s.r = iterReader{iter: iter, cons: cons, durable: o.Durable != ""}
	}
	defer s.r.stop()

	if o.Deliver == DeliverLast && s.pending > 0 {
		if more, err := s.printLastOfEach(ctx); !more || err != nil {
			return err
		}
	}
	return s.printEach(ctx)
}

// session is one run of tail: where it reads, where it prints, and how many
// events of the history it started with are still to come.
type session struct {
	o       Options
	r       reader
	p       printer
	pending uint64
}

// next returns the next event; nil at the end of the run (the context
// ended, or the history is read and the run does not follow).
func (s *session) next(ctx context.Context) (*held, error) {
	var wait time.Duration
	caughtUp := s.pending == 0 && !s.o.Follow
	if caughtUp {
		// The consumer's pending count can lag a publish that just
		// happened; give the server a moment before calling it the end.
		wait = caughtUpWait
	}
	msg, err := s.r.next(ctx, wait, s.pending)
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) || caughtUp && errors.Is(err, nats.ErrTimeout) {
			return nil, nil
		}
		return nil, fmt.Errorf("next event: %w", err)
	}
	meta, err := msg.Metadata()
	if err != nil {
		return nil, err
	}
	if s.pending > 0 {
		s.pending = meta.NumPending
	}
	ev, decodeErr := consumer.DecodeMsg(ctx, &nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()})
	return &held{seq: meta.Sequence.Stream, msg: msg, ev: ev, err: decodeErr}, nil
}

// printLastOfEach reads the history up to where it was at the start, keeps
// the newest event of each Student and prints those in stream order. more
// is false when the run ended meanwhile.
func (s *session) printLastOfEach(ctx context.Context) (more bool, err error) {
	bySubject := map[string]*held{}
	for s.pending > 0 {
		h, err := s.next(ctx)
		if h == nil || err != nil {
			return false, err
		}
		key := h.msg.Subject()
		if h.ev != nil {
			key = h.ev.Source() + " " + h.ev.Subject()
		}
		if old, ok := bySubject[key]; ok {
			if err := ack(s.o, old.msg); err != nil {
				return false, err
			}
		}
		bySubject[key] = h
	}
	batch := slices.SortedFunc(maps.Values(bySubject), func(a, b *held) int { return cmp.Compare(a.seq, b.seq) })
	for _, h := range batch {
		if err := s.printAndAck(h); err != nil {
			return false, err
		}
	}
	return true, nil
}

// printEach prints every event as it comes.
func (s *session) printEach(ctx context.Context) error {
	for {
		h, err := s.next(ctx)
		if h == nil || err != nil {
			return err
		}
		if err := s.printAndAck(h); err != nil {
			return err
		}
	}
}

func (s *session) printAndAck(h *held) error {
	if err := s.p.print(h); err != nil {
		return err
	}
	return ack(s.o, h.msg)
}

// caughtUpWait is how long a non-following tail waits for one more event
// once the stream looks read to its end.
const caughtUpWait = 500 * time.Millisecond

// reader hands out the consumer's messages one at a time.
type reader interface {
	// next waits up to wait (0: until ctx ends) and returns nats.ErrTimeout
	// when nothing came. pending is how many messages are known to wait.
	next(ctx context.Context, wait time.Duration, pending uint64) (jetstream.Msg, error)
	stop()
}

// iterReader keeps a pull request open all the time: the reader for a
// following tail.
type iterReader struct {
	iter    jetstream.MessagesContext
	cons    jetstream.Consumer
	durable bool
}

func (r iterReader) next(ctx context.Context, wait time.Duration, _ uint64) (jetstream.Msg, error) {
	if wait > 0 {
		return r.iter.Next(jetstream.NextMaxWait(wait))
	}
	return r.iter.Next(jetstream.NextContext(ctx))
}

// stop ends the pull request. A durable consumer goes on without this tail,
// so nothing may stay promised to it: the iterator is drained (its
// subscription ends only once the server has it removed, so no message
// published afterwards goes to this tail) and every message that reached it
// unprinted is handed back at once, not after the ack wait, and is the
// next run's first.
//
// The messages are handed back only after the drain: one handed back while
// the subscription still had its pull request would come straight back to
// it, and be lost to the next run until the ack wait. The server also keeps
// the ended pull request on its list until it next looks at the consumer's
// waiting requests, and a message handed back before that is tried on it
// and put at the end of the redelivery queue, behind later ones: asking for
// the consumer's info clears the list first, so they come back in order.
func (r iterReader) stop() {
	if !r.durable {
		r.iter.Stop()
		return
	}
	r.iter.Drain()
	var unprinted []jetstream.Msg
	for {
		msg, err := r.iter.Next(jetstream.NextMaxWait(stopWait))
		if err != nil {
			break
		}
		unprinted = append(unprinted, msg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopWait)
	defer cancel()
	_, _ = r.cons.Info(ctx)
	for _, msg := range unprinted {
		_ = msg.Nak()
	}
}

// stopWait bounds how long stop waits for the server to end a durable
// tail's subscription.
const stopWait = 5 * time.Second

// fetchReader reads in batches and always waits for a batch to end, so it
// leaves no pull request behind when the tail returns. An iterator's request
// outlives Stop for a moment: an event published right after a durable tail
// returned could be handed to that dead request, and the durable consumer
// would give it to the next run only after its ack wait.
type fetchReader struct {
	cons  jetstream.Consumer
	batch jetstream.MessageBatch
}

const (
	fetchBatch = 256
	// fetchWait bounds one request while the stream is not read to its end.
	fetchWait = 5 * time.Second
)

func (r *fetchReader) next(ctx context.Context, wait time.Duration, pending uint64) (jetstream.Msg, error) {
	for {
		if r.batch == nil {
			// A request for no more than what waits is complete as soon
			// as it arrives; one that may wait asks for a whole batch.
			limit, size := wait, fetchBatch
			if wait == 0 {
				limit, size = fetchWait, int(min(max(pending, 1), fetchBatch))
			}
			// With a maximum wait (not a context) the client waits for the
			// server to end the request.
			batch, err := r.cons.Fetch(size, jetstream.FetchMaxWait(limit))
			if err != nil {
				return nil, err
			}
			r.batch = batch
		}
		select {
		case msg, ok := <-r.batch.Messages():
			if ok {
				return msg, nil
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		// The batch is over: full, or expired on the server.
		err := r.batch.Error()
		r.batch = nil
		switch {
		case err != nil:
			return nil, err
		case wait > 0:
			return nil, nats.ErrTimeout
		}
	}
}

func (r *fetchReader) stop() {}

type held struct {
	seq uint64
	msg jetstream.Msg
	ev  *cloudevents.Event
	err error
}

func ack(o Options, msg jetstream.Msg) error {
	if o.Durable == "" {
		return nil
	}
	if err := msg.DoubleAck(context.Background()); err != nil {
		return fmt.Errorf("ack: %w", err)
	}
	return nil
}

func openConsumer(ctx context.Context, js jetstream.JetStream, o Options) (jetstream.Consumer, error) {
	policy := jetstream.DeliverNewPolicy
	var startSeq uint64
	var startTime *time.Time
	switch o.Deliver {
	case DeliverNew, "":
	case DeliverAll, DeliverLast:
		policy = jetstream.DeliverAllPolicy
	case DeliverSince:
		policy = jetstream.DeliverByStartTimePolicy
		startTime = &o.Since
	case DeliverSequence:
		policy = jetstream.DeliverByStartSequencePolicy
		startSeq = o.FromSequence
	default:
		return nil, fmt.Errorf("unknown deliver policy %q", o.Deliver)
	}
	if o.Durable == "" {
		c, err := js.OrderedConsumer(ctx, o.Stream, jetstream.OrderedConsumerConfig{
			FilterSubjects: o.Subjects,
			DeliverPolicy:  policy,
			OptStartSeq:    startSeq,
			OptStartTime:   startTime,
		})
		if err != nil {
			return nil, fmt.Errorf("consumer on stream %s: %w", o.Stream, err)
		}
		return c, nil
	}
	// A durable consumer that exists resumes where it stopped; its start
	// policy only matters the first time.
	if c, err := js.Consumer(ctx, o.Stream, o.Durable); err == nil {
		return c, nil
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("durable consumer %s: %w", o.Durable, err)
	}
	cfg := jetstream.ConsumerConfig{
		Durable:       o.Durable,
		Description:   "student-bridge tail",
		DeliverPolicy: policy,
		OptStartSeq:   startSeq,
		OptStartTime:  startTime,
		AckPolicy:     jetstream.AckExplicitPolicy,
	}
	if len(o.Subjects) == 1 {
		cfg.FilterSubject = o.Subjects[0]
	} else {
		cfg.FilterSubjects = o.Subjects
	}
	c, err := js.CreateConsumer(ctx, o.Stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("create durable consumer %s: %w", o.Durable, err)
	}
	return c, nil
}

type printer struct {
	out  io.Writer
	json bool
}

func (p printer) print(h *held) error {
	if h.err != nil {
		_, err := fmt.Fprintf(p.out, "#%d %s: not a CloudEvent: %v\n", h.seq, h.msg.Subject(), h.err)
		return err
	}
	if p.json {
		b, err := json.Marshal(h.ev)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(p.out, "%s\n", b)
		return err
	}
	_, err := fmt.Fprintln(p.out, Line(h.seq, h.ev))
	return err
}

// Line renders an event as one readable line: time, stream sequence,
// operation, namespace/name, generation, and the spec (on updates, what
// changed).
func Line(seq uint64, ev *cloudevents.Event) string {
	op := studentv1.Operation(ev.Type())
	var d studentv1.StudentEventData
	if err := json.Unmarshal(ev.Data(), &d); err != nil {
		return fmt.Sprintf("%s #%d %-8s %s (data: %v)", ev.Time().UTC().Format(time.RFC3339), seq, op, ev.Subject(), err)
	}
	var details []string
	if prev := d.PreviousSpec; prev != nil && op == studentv1.OperationUpdated {
		if prev.Name != d.Spec.Name {
			details = append(details, fmt.Sprintf("name: %q -> %q", prev.Name, d.Spec.Name))
		}
		if prev.School != d.Spec.School {
			details = append(details, fmt.Sprintf("school: %q -> %q", prev.School, d.Spec.School))
		}
		if len(details) == 0 {
			details = append(details, "labels changed")
		}
	} else {
		details = append(details, fmt.Sprintf("name=%q school=%q", d.Spec.Name, d.Spec.School))
	}
	if len(d.Metadata.Labels) > 0 {
		var ls []string
		for _, k := range slices.Sorted(maps.Keys(d.Metadata.Labels)) {
			ls = append(ls, k+"="+d.Metadata.Labels[k])
		}
		details = append(details, "labels="+strings.Join(ls, ","))
	}
	return fmt.Sprintf("%s #%d %-8s %s gen=%d %s", ev.Time().UTC().Format(time.RFC3339), seq, op, ev.Subject(), d.Metadata.Generation, strings.Join(details, " "))
}
