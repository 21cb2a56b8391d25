package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// snapshot asks the bridge for a snapshot and returns the stream's last
// sequence once every snapshot event is in it. With Fleet it asks the
// bridge of every cluster the stream sources.
func (m *Mirror) snapshot(ctx context.Context, stream jetstream.Stream, firstSeq uint64) (uint64, error) {
	rctx, cancel := context.WithTimeout(ctx, m.o.SnapshotTimeout)
	defer cancel()
	if !m.o.Fleet {
		if _, err := m.requestSnapshot(rctx, m.o.SnapshotSubject, firstSeq); err != nil {
			return 0, err
		}
	} else {
		for _, src := range stream.CachedInfo().Config.Sources {
			// The snapshot's events reach the stream as the cluster's
			// others do: those sourced by now are rebuilt from, the
			// others come as live changes.
			if cluster, ok := fleetSource(src); ok {
				if _, err := m.requestSnapshot(rctx, m.o.SnapshotSubject+"."+cluster, firstSeq); err != nil {
					return 0, err
				}
			}
		}
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("consumer: stream %s: %w", m.o.Stream, err)
	}
	return info.State.LastSeq, nil
}

func (m *Mirror) requestSnapshot(ctx context.Context, subject string, firstSeq uint64) (studentv1.SnapshotReply, error) {
	body, _ := json.Marshal(studentv1.SnapshotRequest{})
	var reply studentv1.SnapshotReply
	msg, err := m.nc.RequestWithContext(ctx, subject, body)
	if err == nil {
		if err = json.Unmarshal(msg.Data, &reply); err == nil && reply.Error != "" {
			err = errors.New(reply.Error)
		}
	}
	if err != nil {
		return reply, fmt.Errorf("consumer: events from before sequence %d left the stream, and the snapshot request on %s failed (is the bridge running with snapshot requests?): %w", firstSeq, subject, err)
	}
	m.log.Info("events the service has not seen left the stream; the bridge published a snapshot", "firstSequence", firstSeq,
		"cluster", reply.Cluster, "snapshot", reply.Run, "students", reply.Published)
	return reply, nil
}

// fleetSource reads a hub stream's source of a cluster's stream (as
// fleet.EnsureHub makes it): the cluster, whose name is its JetStream
// domain.
func fleetSource(src *jetstream.StreamSource) (cluster string, ok bool) {
	if src.External == nil {
		return "", false
	}
	return studentv1.DomainOfAPI(src.External.APIPrefix)
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
	defer func() { _ = stream.DeleteConsumer(context.WithoutCancel(ctx), name) }()
	var from uint64 // the stream sequence read last
	for resets := 0; ; resets++ {
		before := from
		done, err := m.foldFrom(ctx, stream, name, from, to, func(seq uint64, ev *event, err error) {
			from = seq
			if err != nil {
				m.log.Warn("skipping an event that is not a Student CloudEvent", "sequence", seq, "reason", err.Error())
			} else {
				apply(ev.desired(seq), ev)
			}
		})
		if err == nil {
			return nil
		}
		if done {
			return fmt.Errorf("consumer: read %s: %w", m.o.Stream, err)
		}
		// The consumer stopped answering (the server it was placed on went
		// down) or went away: read on from the event after the last one
		// read, through a new one, which the server may place elsewhere.
		if from > before {
			resets = 0 // read on before it stopped: a new run of resets
		}
		if resets == rebuildResets || ctx.Err() != nil {
			return fmt.Errorf("consumer: read %s: %w", m.o.Stream, err)
		}
		m.log.Warn("the rebuild's reading of the stream stopped; reading on through a new consumer", "after", from, "reason", err.Error())
	}
}

// rebuildResets is how many times in a row a rebuild reads on through a
// new consumer before it gives up; rebuildHeartbeat is how often the
// server says the rebuild's consumer is alive (two missed: a new one).
const (
	rebuildResets    = 5
	rebuildHeartbeat = 2 * time.Second
)

// foldFrom reads the stream's events after sequence from (0: from the
// first) up to sequence to through the consumer name, made for it, and
// hands each to apply. done says the error is not one a new consumer
// could read on after.
func (m *Mirror) foldFrom(ctx context.Context, stream jetstream.Stream, name string, from, to uint64, apply func(seq uint64, ev *event, err error)) (done bool, err error) {
	if err := stream.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return false, err
	}
	cfg := jetstream.ConsumerConfig{
		Name:              name,
		Description:       "student-bridge consumer.Mirror of service " + m.o.Service + ", rebuilding",
		FilterSubject:     m.o.Subjects,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: time.Minute,
		Replicas:          1,
		MemoryStorage:     true,
	}
	if from > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from+1
	}
	cons, err := stream.CreateConsumer(ctx, cfg)
	if err != nil {
		return false, err
	}
	it, err := cons.Messages(jetstream.PullHeartbeat(rebuildHeartbeat))
	if err != nil {
		return false, err
	}
	defer it.Stop()
	var delivered uint64
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return ctx.Err() != nil, err
		}
		md, err := msg.Metadata()
		if err != nil {
			return true, err
		}
		// Nothing acknowledges here, so nothing would redeliver a message
		// lost on the way: a gap in the consumer's count reads on from
		// the last event read rather than leave a state missing an event.
		if delivered++; md.Sequence.Consumer != delivered {
			return false, fmt.Errorf("message %d of the rebuild came as %d", delivered, md.Sequence.Consumer)
		}
		if md.Sequence.Stream > to {
			return true, nil
		}
		ev, err := decode(msg)
		apply(md.Sequence.Stream, ev, err)
		if md.Sequence.Stream >= to || md.NumPending == 0 {
			return true, nil
		}
	}
}
