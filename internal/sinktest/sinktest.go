// Package sinktest has in-memory implementations of sink.Sink and sink.Store
// for tests of code that depends on those interfaces (the reconciler). They
// keep the contracts (a compare-and-set store, sequence numbers, the
// sentinel errors) and can be told to fail.
package sinktest

import (
	"context"
	"fmt"
	"sync"

	cloudevents "github.com/cloudevents/sdk-go/v2"

	"github.com/student-bridge/student-bridge/sink"
)

// Sink records every event it accepts.
type Sink struct {
	// Acked, if set, is called with each event the Sink accepts, once it
	// has (the moment its ack reaches the bridge): a test makes the bridge
	// fail right after a publish there.
	Acked func(cloudevents.Event)

	mu     sync.Mutex
	events []cloudevents.Event
	ids    map[string]uint64
	err    error
}

var _ sink.Sink = (*Sink)(nil)

// Publish implements sink.Sink. An event whose id was accepted before is a
// duplicate, as in a JetStream stream's duplicate window.
func (s *Sink) Publish(_ context.Context, ev cloudevents.Event) (sink.Receipt, error) {
	receipt, err := s.publish(ev)
	if err == nil && !receipt.Duplicate && s.Acked != nil {
		s.Acked(ev)
	}
	return receipt, err
}

func (s *Sink) publish(ev cloudevents.Event) (sink.Receipt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return sink.Receipt{}, s.err
	}
	if s.ids == nil {
		s.ids = map[string]uint64{}
	}
	if seq, ok := s.ids[ev.ID()]; ok {
		return sink.Receipt{Subject: ev.Type(), Sequence: seq, Duplicate: true}, nil
	}
	s.events = append(s.events, ev)
	seq := uint64(len(s.events))
	s.ids[ev.ID()] = seq
	return sink.Receipt{Subject: ev.Type(), Sequence: seq}, nil
}

// Fail makes every Publish return err until Fail(nil).
func (s *Sink) Fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

// Events returns the accepted events in order.
func (s *Sink) Events() []cloudevents.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]cloudevents.Event(nil), s.events...)
}

// Store is a compare-and-set key-value store.
type Store struct {
	mu   sync.Mutex
	recs map[string]sink.Record
	rev  uint64
	err  error
}

var _ sink.Store = (*Store)(nil)

// Fail makes every operation return err until Fail(nil).
func (s *Store) Fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

// Load implements sink.Store.
func (s *Store) Load(context.Context) ([]sink.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	out := make([]sink.Record, 0, len(s.recs))
	for _, r := range s.recs {
		out = append(out, r)
	}
	return out, nil
}

// Get implements sink.Store.
func (s *Store) Get(_ context.Context, key string) (sink.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return sink.Record{}, s.err
	}
	r, ok := s.recs[key]
	if !ok {
		return sink.Record{}, fmt.Errorf("%w: %s", sink.ErrNotFound, key)
	}
	return r, nil
}

// Put implements sink.Store.
func (s *Store) Put(_ context.Context, key string, value []byte, revision uint64) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return 0, s.err
	}
	if s.recs == nil {
		s.recs = map[string]sink.Record{}
	}
	if s.recs[key].Revision != revision {
		return 0, fmt.Errorf("%w: %s is at revision %d, not %d", sink.ErrConflict, key, s.recs[key].Revision, revision)
	}
	s.rev++
	s.recs[key] = sink.Record{Key: key, Value: append([]byte(nil), value...), Revision: s.rev}
	return s.rev, nil
}

// Delete implements sink.Store.
func (s *Store) Delete(_ context.Context, key string, revision uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if r, ok := s.recs[key]; ok && r.Revision != revision {
		return fmt.Errorf("%w: %s is at revision %d, not %d", sink.ErrConflict, key, r.Revision, revision)
	}
	delete(s.recs, key)
	return nil
}

// Keys returns the keys that have a record.
func (s *Store) Keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.recs {
		out = append(out, k)
	}
	return out
}
