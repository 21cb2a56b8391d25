// Package natssink publishes CloudEvents on NATS, with JetStream acknowledgement
// by default, following the CloudEvents NATS protocol binding.
package natssink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	ceevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/student-bridge/student-bridge/sink"
)

// Mode selects the delivery guarantee of a Publisher.
type Mode string

const (
	// JetStream publishes and waits for the stream's acknowledgement; the
	// CloudEvent id is the Nats-Msg-Id, so the stream drops republished
	// events within its duplicate window. At-least-once.
	JetStream Mode = "jetstream"
	// Core publishes on core NATS and flushes; nobody stores the event and a
	// subscriber that is not connected misses it. At-most-once.
	Core Mode = "core"
)

// Config configures a Publisher.
type Config struct {
	// Mode is JetStream (default) or Core.
	Mode Mode
	// Encoding is Structured (default) or Binary.
	Encoding Encoding
	// Layout maps events to subjects.
	Layout SubjectLayout
	// Stream, when set in JetStream mode, is the stream the ack must come
	// from; an ack from any other stream is an error.
	Stream string
	// AckTimeout bounds one publish, including the wait for the ack, when
	// the caller's context has no earlier deadline. Default 5s.
	AckTimeout time.Duration
	// Mover, if set, is told how each publish went.
	Mover *Mover
}

// Publisher is a sink.Sink on a NATS connection it does not own: closing the
// connection is the caller's job.
type Publisher struct {
	nc       *nats.Conn
	requests *requests
	js       jetstream.JetStream
	cfg      Config

	// capture is JetStream's last answer to which stream captures the
	// publisher's subjects (see capturing).
	capture struct {
		mu     sync.Mutex
		at     time.Time
		stream string
		err    error
	}
}

var _ sink.Sink = (*Publisher)(nil)

// NewPublisher returns a Publisher on nc.
func NewPublisher(nc *nats.Conn, cfg Config) (*Publisher, error) {
	if nc == nil {
		return nil, errors.New("natssink: nil connection")
	}
	if cfg.Layout.layout == "" {
		return nil, errors.New("natssink: subject layout not set")
	}
	if cfg.Mode == "" {
		cfg.Mode = JetStream
	}
	if cfg.Encoding == "" {
		cfg.Encoding = Structured
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = 5 * time.Second
	}
	p := &Publisher{nc: nc, requests: newRequests(nc), cfg: cfg}
	switch cfg.Mode {
	case JetStream:
		js, err := jetstream.New(nc)
		if err != nil {
			return nil, fmt.Errorf("natssink: jetstream: %w", err)
		}
		p.js = js
	case Core:
	default:
		return nil, fmt.Errorf("natssink: unknown mode %q", cfg.Mode)
	}
	if cfg.Encoding != Structured && cfg.Encoding != Binary {
		return nil, fmt.Errorf("natssink: unknown encoding %q", cfg.Encoding)
	}
	return p, nil
}

// Publish implements sink.Sink. It returns nil only once JetStream
// acknowledged the event (JetStream mode) or the server received it (Core
// mode). Nothing is reported as sent while the connection is down.
func (p *Publisher) Publish(ctx context.Context, event cloudevents.Event) (sink.Receipt, error) {
	return p.PublishEncoded(ctx, event, nil)
}

// PublishEncoded is Publish of an event the caller has already encoded
// as JSON (json.Marshal of the event: a structured CloudEvent, as the
// bridge's reservation holds it). In the structured encoding the message
// is that JSON, not encoded again; in the binary one, or without it, the
// event is encoded as Publish does.
func (p *Publisher) PublishEncoded(ctx context.Context, event cloudevents.Event, encoded []byte) (sink.Receipt, error) {
	msg, err := p.message(ctx, event, encoded)
	if err != nil {
		return sink.Receipt{}, err
	}
	subject := msg.Subject
	if err := p.connected(); err != nil {
		return sink.Receipt{}, err
	}
	if p.cfg.Mode == Core {
		if err := p.nc.PublishMsg(msg); err != nil {
			return sink.Receipt{}, p.classify(ctx, subject, err)
		}
		flushCtx, cancel := context.WithTimeout(ctx, p.cfg.AckTimeout)
		defer cancel()
		if err := p.nc.FlushWithContext(flushCtx); err != nil {
			return sink.Receipt{}, p.classify(ctx, subject, err)
		}
		return sink.Receipt{Subject: subject}, nil
	}

	msg.Header.Set(jetstream.MsgIDHeader, event.ID())
	if p.cfg.Stream != "" {
		msg.Header.Set(jetstream.ExpectedStreamHeader, p.cfg.Stream)
	}
	count(requestPublish)
	ack, err := p.requests.publishJS(ctx, msg, p.cfg.Stream, p.cfg.AckTimeout)
	if err != nil {
		return sink.Receipt{}, p.cfg.Mover.Observe(p.classify(ctx, subject, err))
	}
	_ = p.cfg.Mover.Observe(nil)
	return sink.Receipt{Subject: subject, Stream: ack.Stream, Sequence: ack.Seq, Duplicate: ack.Duplicate}, nil
}

// message is event as the NATS message it is published as; encoded, if
// not nil, is the event as JSON.
func (p *Publisher) message(ctx context.Context, event cloudevents.Event, encoded []byte) (*nats.Msg, error) {
	subject := p.cfg.Layout.Subject(event)
	var msg *nats.Msg
	if encoded != nil && (p.cfg.Encoding == Structured || p.cfg.Encoding == "") {
		msg = nats.NewMsg(subject)
		msg.Header.Set(headerContentType, format.JSON.MediaType())
		msg.Data = encoded
	} else {
		var err error
		if msg, err = EncodeMsg(ctx, event, subject, p.cfg.Encoding); err != nil {
			return nil, err
		}
	}
	// The W3C trace context also as a plain traceparent header, in both
	// encodings: nats-server's message tracing follows that header (an
	// account with msg_trace set), and tools that know no CloudEvents
	// see it. The event itself carries it as its traceparent attribute.
	if tp := traceParent(event); tp != "" {
		msg.Header.Set("traceparent", tp)
	}
	if err := p.fits(msg); err != nil {
		return nil, err
	}
	return msg, nil
}

// traceParent is event's traceparent extension ("" if none), read
// without the copy of every extension Extensions makes.
func traceParent(event cloudevents.Event) string {
	if c, ok := event.Context.(*ceevent.EventContextV1); ok {
		tp, _ := c.Extensions["traceparent"].(string)
		return tp
	}
	tp, _ := event.Extensions()["traceparent"].(string)
	return tp
}

// fits refuses a message larger than the server takes.
func (p *Publisher) fits(msg *nats.Msg) error {
	if limit := p.nc.MaxPayload(); limit > 0 && int64(len(msg.Data)+headerSize(msg)) > limit {
		return fmt.Errorf("%w: %d bytes on %s, server allows %d", sink.ErrTooLarge, len(msg.Data)+headerSize(msg), msg.Subject, limit)
	}
	return nil
}

func (p *Publisher) connected() error {
	switch {
	case p.nc.IsClosed():
		return sink.ErrClosed
	case !p.nc.IsConnected():
		return fmt.Errorf("%w: %s", sink.ErrNotConnected, p.nc.Status())
	}
	return nil
}

// JetStream's error codes that nats.go does not name, after the
// server's names (nats-server's server/errors.json).
const (
	// errCodeClusterNotAvail (JSClusterNotAvailErr): JetStream
	// temporarily unavailable (no meta leader).
	errCodeClusterNotAvail jetstream.ErrorCode = 10008
	// errCodeDuplicateInProcess (JSStreamDuplicateMessageConflict): an
	// earlier copy of the event (same Nats-Msg-Id) is in flight, not yet
	// stored or refused.
	errCodeDuplicateInProcess jetstream.ErrorCode = 10158
	// errCodeExpectedSeqUnavail (JSStreamExpectedLastSeqPerSubjectNotReady):
	// a stream's expected sequences are not known yet (a new leader).
	errCodeExpectedSeqUnavail jetstream.ErrorCode = 10163
)

// errCodesUnavailable are the JetStream errors of a cluster that cannot
// store now but may in a moment.
var errCodesUnavailable = []jetstream.ErrorCode{errCodeClusterNotAvail, errCodeExpectedSeqUnavail, errCodeDuplicateInProcess}

// isUnavailable reports whether err is JetStream saying it cannot store
// now but may in a moment.
func isUnavailable(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && slices.Contains(errCodesUnavailable, apiErr.ErrorCode)
}

// classify wraps err with the sink sentinel that says what the caller can
// do; ctx is the caller's (not the publish's, which may have timed out).
func (p *Publisher) classify(ctx context.Context, subject string, err error) error {
	answered, classified := p.classifyAnswered(subject, err)
	if !answered {
		return p.noStreamAnswered(ctx, subject, err)
	}
	return classified
}

// classifyAnswered is classify without asking JetStream anything:
// answered is false for a JetStream publish that no stream answered (no
// answer at all, or none within the ack timeout), which only JetStream can
// tell apart (noStreamAnswered). On core NATS there is no stream to ask
// about.
func (p *Publisher) classifyAnswered(subject string, err error) (answered bool, classified error) {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		return true, fmt.Errorf("%w: publish %s: %w", sink.ErrTooLarge, subject, err)
	case isUnavailable(err):
		return true, fmt.Errorf("%w: publish %s: %w", sink.ErrUnavailable, subject, err)
	case errors.As(err, &apiErr):
		return true, fmt.Errorf("%w: publish %s: %w", sink.ErrRejected, subject, err)
	case errors.Is(err, nats.ErrConnectionClosed):
		return true, fmt.Errorf("%w: publish %s: %w", sink.ErrClosed, subject, err)
	case !p.nc.IsConnected(), disconnected(err):
		return true, fmt.Errorf("%w: publish %s: %w", sink.ErrNotConnected, subject, err)
	case p.js != nil && noAnswer(err):
		return false, nil
	}
	return true, fmt.Errorf("publish %s: %w", subject, err)
}

// disconnected reports whether err says the connection was down when the
// request went out: it may be back by the time the error is read.
func disconnected(err error) bool {
	return errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrReconnectBufExceeded)
}

// noAnswer reports whether err says a JetStream request got no answer at
// all, or none within its timeout.
func noAnswer(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, context.DeadlineExceeded)
}

// noStreamAnswered tells the two reasons a publish gets no answer from a
// stream apart by what JetStream says captures the subject (capturing):
// no stream (a rejection: retrying does not help until someone makes one),
// or one whose leader is out of reach (an election, a lost quorum:
// unavailable for a moment). When JetStream cannot say either, it is
// unavailable too.
func (p *Publisher) noStreamAnswered(ctx context.Context, subject string, err error) error {
	stream, lookupErr := p.capturing(ctx, subject)
	switch {
	case errors.Is(lookupErr, jetstream.ErrStreamNotFound):
		return fmt.Errorf("%w: publish %s: no stream captures the subject: %w", sink.ErrRejected, subject, err)
	case lookupErr != nil:
		return fmt.Errorf("%w: publish %s: no stream answered, and JetStream could not say which captures the subject (%v): %w", sink.ErrUnavailable, subject, lookupErr, err)
	}
	return fmt.Errorf("%w: publish %s: stream %s captures the subject but did not answer (its leader is out of reach: an election, or no quorum): %w", sink.ErrUnavailable, subject, stream, err)
}

// captureFresh is how long JetStream's answer to which stream captures the
// publisher's subjects stands for every publish that fails meanwhile.
const captureFresh = 5 * time.Second

// capturing returns the stream that captures subject, as JetStream last
// said within captureFresh: in an outage every publish fails, and one
// request answers them all rather than one more per failure. Every subject
// of a publisher is its layout's, which one stream captures. A caller
// that is gone (ctx done) gets its error, and nobody is asked.
func (p *Publisher) capturing(ctx context.Context, subject string) (string, error) {
	c := &p.capture
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < captureFresh {
		return c.stream, c.err
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	lookup, cancel := context.WithTimeout(ctx, p.cfg.AckTimeout)
	defer cancel()
	count(requestLookup)
	stream, err := p.js.StreamNameBySubject(lookup, subject)
	if ctx.Err() == nil { // an answer cut short by the caller is no answer
		c.at, c.stream, c.err = time.Now(), stream, err
	}
	return stream, err
}

func headerSize(msg *nats.Msg) int {
	n := 12 // "NATS/1.0\r\n" + final "\r\n"
	for k, vs := range msg.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}
