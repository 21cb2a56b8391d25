package natssink

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/student-bridge/student-bridge/sink"
)

// StreamRecords is the record store kept in the events' own stream, under
// subjects of their own (RecordsSubject), and a sink.Committer: a change is
// one atomic batch (ADR-50, nats-server 2.12) of its event and its record,
// so no moment exists at which the event is stored and its record is not.
//
// A record is the last message of its subject: each write rolls the
// subject up to itself (Nats-Rollup: sub), never expires (Nats-TTL: never,
// whatever the stream's max age) and is fenced by the sequence of the
// subject's last message (Nats-Expected-Last-Subject-Sequence), the
// compare-and-set a key-value bucket gives. The stream must allow atomic
// batches, per-message TTLs and rollups (StreamConfig.Records).
type StreamRecords struct {
	p       *Publisher
	stream  string
	subject string // the records' subject prefix, RecordsSubject(...)
	timeout time.Duration
	mover   *Mover
}

var _ sink.Committer = (*StreamRecords)(nil)

// Headers of the ADR-50 atomic batch (nats-server 2.12).
const (
	batchIDHeader       = "Nats-Batch-Id"
	batchSequenceHeader = "Nats-Batch-Sequence"
	batchCommitHeader   = "Nats-Batch-Commit"
	// recordHeader marks a record's message: "committed" when its event
	// is the message before it in the stream, "deleted" for a removed
	// record.
	recordHeader = "Student-Bridge-Record"
	// tombstoneTTL is how long a removed record's marker stays: long
	// enough for a writer with a stale revision to be refused.
	tombstoneTTL = "1h"
)

// JetStream errors of an atomic batch: its record's fence was stale, or
// its event is in the stream already (and so is its record); and the
// ones worth a retry: a batch the server did not get whole, too many
// batches in flight.
const (
	errCodeBatchDuplicate  jetstream.ErrorCode = 10201
	errCodeBatchIncomplete jetstream.ErrorCode = 10176
	errCodeBatchInflight   jetstream.ErrorCode = 10211
)

// RecordsSubject is the subject prefix of the records in a stream whose
// events go out under prefix: "student" gives "student-records", which no
// subscriber of "student.>" reads.
func RecordsSubject(prefix string) string { return prefix + "-records" }

// NewStreamRecords returns the record store in stream, whose events p
// publishes under prefix. p must publish to JetStream.
func NewStreamRecords(p *Publisher, stream, prefix string, mover *Mover) (*StreamRecords, error) {
	if p.js == nil {
		return nil, errors.New("natssink: records in the stream need JetStream mode")
	}
	return &StreamRecords{p: p, stream: stream, subject: RecordsSubject(prefix), timeout: p.cfg.AckTimeout, mover: mover}, nil
}

func (s *StreamRecords) key(subject string) string { return strings.TrimPrefix(subject, s.subject+".") }

// Load implements sink.Store: the last message of every record subject,
// read by an ordered consumer that delivers the last per subject.
func (s *StreamRecords) Load(ctx context.Context) ([]sink.Record, error) {
	// On a cluster a consumer just made may not answer its first request
	// yet ("no responders"): asked again, for up to the timeout.
	deadline := time.Now().Add(s.timeout)
	for {
		out, err := s.load(ctx)
		if !errors.Is(err, nats.ErrNoResponders) || time.Now().After(deadline) {
			return out, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *StreamRecords) load(ctx context.Context) ([]sink.Record, error) {
	count(requestLoad)
	c, err := s.p.js.OrderedConsumer(ctx, s.stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{s.subject + ".>"},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return nil, s.classify("load", err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, s.classify("load", err)
	}
	var out []sink.Record
	pending := info.NumPending
	for pending > 0 {
		// No more than are pending: Fetch waits for as many as it asks.
		batch, err := c.Fetch(int(min(pending, 500)), jetstream.FetchMaxWait(s.timeout))
		if err != nil {
			return nil, s.classify("load", err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			meta, err := m.Metadata()
			if err != nil {
				return nil, fmt.Errorf("record store: load: %w", err)
			}
			pending = meta.NumPending
			if rec, ok := s.record(m.Subject(), m.Headers(), m.Data(), meta.Sequence.Stream); ok {
				out = append(out, rec)
			}
		}
		if err := batch.Error(); err != nil {
			return nil, s.classify("load", err)
		}
		if n == 0 {
			return nil, s.classify("load", context.DeadlineExceeded)
		}
	}
	return out, nil
}

// record is a record's message as a sink.Record; false for a removed one.
func (s *StreamRecords) record(subject string, h nats.Header, data []byte, seq uint64) (sink.Record, bool) {
	rec := sink.Record{Key: s.key(subject), Value: data, Revision: seq}
	switch h.Get(recordHeader) {
	case "deleted":
		return rec, false
	case "committed":
		rec.EventSequence = seq - 1
	}
	return rec, true
}

// Get implements sink.Store, asking the stream's leader.
func (s *StreamRecords) Get(ctx context.Context, key string) (sink.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	count(requestRead)
	seq, h, data, err := lastMsg(ctx, s.p.nc, s.stream, s.subject+"."+key)
	if errors.Is(err, errNoMessage) {
		return sink.Record{}, fmt.Errorf("%w: get %s", sink.ErrNotFound, key)
	}
	if err != nil {
		return sink.Record{}, s.mover.Observe(s.classify("get "+key, err))
	}
	rec, ok := s.record(s.subject+"."+key, h, data, seq)
	if !ok {
		return sink.Record{}, fmt.Errorf("%w: get %s: removed", sink.ErrNotFound, key)
	}
	return rec, nil
}

// recordMsg is the message that writes value as key's record at revision.
func (s *StreamRecords) recordMsg(key string, value []byte, revision uint64) *nats.Msg {
	m := nats.NewMsg(s.subject + "." + key)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(revision, 10))
	m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	m.Header.Set(jetstream.MsgTTLHeader, "never")
	m.Data = value
	return m
}

// Put implements sink.Store.
func (s *StreamRecords) Put(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	count(requestWrite)
	return s.write(ctx, "put "+key, s.recordMsg(key, value, revision))
}

// Delete implements sink.Store: a marker that ends the record, fenced like
// a write, gone after an hour or the stream's max age, whichever is first
// (then the subject is empty, and a stale writer's fence still fails).
func (s *StreamRecords) Delete(ctx context.Context, key string, revision uint64) error {
	m := s.recordMsg(key, nil, revision)
	m.Header.Set(recordHeader, "deleted")
	m.Header.Set(jetstream.MsgTTLHeader, tombstoneTTL)
	count(requestDelete)
	_, err := s.write(ctx, "delete "+key, m)
	return err
}

func (s *StreamRecords) write(ctx context.Context, op string, m *nats.Msg) (uint64, error) {
	m.Header.Set(jetstream.ExpectedStreamHeader, s.stream)
	ack, err := s.p.requests.publishJS(ctx, m, s.stream, s.timeout)
	if err != nil {
		return 0, s.mover.Observe(s.classify(op, err))
	}
	_ = s.mover.Observe(nil)
	return ack.Seq, nil
}

// Commit implements sink.Committer: the event, then the record, one
// atomic batch whose commit (the record) is the only message that waits
// for an answer. One round trip.
func (s *StreamRecords) Commit(ctx context.Context, event cloudevents.Event, key string, value []byte, revision uint64) (sink.Receipt, uint64, error) {
	ev, err := s.p.message(ctx, event, nil)
	if err != nil {
		return sink.Receipt{}, 0, err
	}
	rec := s.recordMsg(key, value, revision)
	rec.Header.Set(recordHeader, "committed")
	if err := s.p.fits(rec); err != nil {
		return sink.Receipt{}, 0, err
	}
	id := rand.Text()
	ev.Header.Set(batchIDHeader, id)
	ev.Header.Set(batchSequenceHeader, "1")
	ev.Header.Set(jetstream.MsgIDHeader, event.ID())
	ev.Header.Set(jetstream.ExpectedStreamHeader, s.stream)
	rec.Header.Set(batchIDHeader, id)
	rec.Header.Set(batchSequenceHeader, "2")
	rec.Header.Set(batchCommitHeader, "1")
	if err := s.p.connected(); err != nil {
		return sink.Receipt{}, 0, err
	}
	if err := s.p.nc.PublishMsg(ev); err != nil {
		return sink.Receipt{}, 0, s.mover.Observe(s.p.classify(ctx, ev.Subject, err))
	}
	count(requestCommit)
	reply, err := s.p.requests.do(ctx, rec, s.timeout)
	if err != nil {
		return sink.Receipt{}, 0, s.mover.Observe(s.p.classify(ctx, ev.Subject, err))
	}
	ack, err := readAck(reply.Data, s.stream)
	if err != nil {
		return sink.Receipt{}, 0, fmt.Errorf("commit %s: bad ack %q: %w", event.ID(), reply.Data, err)
	}
	if ack.Error != nil {
		return sink.Receipt{}, 0, s.mover.Observe(s.classify("commit "+event.ID(), ack.Error))
	}
	if ack.Count != 2 || ack.Stream != s.stream {
		return sink.Receipt{}, 0, fmt.Errorf("commit %s: ack of %d message(s) from stream %q, want 2 from %q", event.ID(), ack.Count, ack.Stream, s.stream)
	}
	_ = s.mover.Observe(nil)
	return sink.Receipt{Subject: ev.Subject, Stream: ack.Stream, Sequence: ack.Seq - 1}, ack.Seq, nil
}

// classify wraps err with the sink sentinel that says what the caller can do.
func (s *StreamRecords) classify(op string, err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamWrongLastSequence, errCodeBatchDuplicate:
			return fmt.Errorf("%w: %s: %w", sink.ErrConflict, op, err)
		case errCodeBatchIncomplete, errCodeBatchInflight:
			return fmt.Errorf("%w: %s: %w", sink.ErrUnavailable, op, err)
		}
	}
	if noAnswer(err) {
		// The stream was found or made at the start: its leader is out
		// of reach (an election, or no quorum).
		return fmt.Errorf("%w: record store: %s: stream %s did not answer: %w", sink.ErrUnavailable, op, s.stream, err)
	}
	// Not reached with an error no stream answered: that is above.
	_, classified := s.p.classifyAnswered(op, err)
	return classified
}
