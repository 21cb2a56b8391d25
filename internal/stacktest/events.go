package stacktest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	cejetstream "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Received is one CloudEvent as a consumer sees it.
type Received struct {
	Subject  string
	Sequence uint64 // stream sequence; 0 for a core subscription
	Header   nats.Header
	Event    cloudevents.Event
	Data     studentv1.StudentEventData
}

// Decode turns a NATS message into a Received with sdk-go, whichever binding
// mode it uses, and checks the event against the contract (CheckContract).
func Decode(msg *nats.Msg) (Received, error) {
	ev, err := binding.ToEvent(context.Background(), cejetstream.NewMessage(msg))
	if err != nil {
		return Received{}, err
	}
	if err := ev.Validate(); err != nil {
		return Received{}, fmt.Errorf("not a valid CloudEvent: %w", err)
	}
	r := Received{Subject: msg.Subject, Header: msg.Header, Event: *ev}
	if err := json.Unmarshal(ev.Data(), &r.Data); err != nil {
		return r, fmt.Errorf("decode data of %s: %w", ev.ID(), err)
	}
	return r, CheckContract(*ev)
}

// DecodeAcrossUpgrade is Decode for a stream the previous release wrote to
// as well: an event without dataschema (it did not set one) must still
// have data its type's schema takes, since the contract's version is the
// same; an event with one is checked as Decode checks it.
func DecodeAcrossUpgrade(msg *nats.Msg) (Received, error) {
	r, err := Decode(msg)
	if err != nil && r.Event.DataSchema() == "" && r.Event.ID() != "" {
		if err := CheckSchema(contract.SchemaName(r.Event.Type()), r.Event.Data()); err != nil {
			return r, fmt.Errorf("event %s (%s) of the previous release: %w", r.Event.ID(), r.Event.Type(), err)
		}
		return r, nil
	}
	return r, err
}

// Subscription collects every event on a core NATS subscription.
type Subscription struct {
	sub *nats.Subscription
	mu  sync.Mutex
	got []Received
	err error
}

// Subscribe subscribes nc to subject (e.g. "student.*").
func Subscribe(nc *nats.Conn, subject string) (*Subscription, error) {
	s := &Subscription{}
	sub, err := nc.Subscribe(subject, func(msg *nats.Msg) {
		r, err := Decode(msg)
		s.mu.Lock()
		defer s.mu.Unlock()
		if err != nil && s.err == nil {
			s.err = err
		}
		s.got = append(s.got, r)
	})
	if err != nil {
		return nil, err
	}
	s.sub = sub
	return s, nc.Flush()
}

// Events returns what arrived so far and the first decode error, if any.
func (s *Subscription) Events() ([]Received, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Received(nil), s.got...), s.err
}

// Unsubscribe stops the subscription.
func (s *Subscription) Unsubscribe() error { return s.sub.Unsubscribe() }

// StreamEvents reads every message stored in stream, in sequence order.
func StreamEvents(ctx context.Context, nc *nats.Conn, stream string) ([]Received, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []Received
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		raw, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("get message %d: %w", seq, err)
		}
		r, err := Decode(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
		if err != nil {
			return nil, err
		}
		r.Sequence = raw.Sequence
		out = append(out, r)
	}
	return out, nil
}

// Eventually polls cond every 50ms until it returns nil or timeout passes,
// and returns cond's last error.
func Eventually(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Counter reads the counter name{label="value"} from controller-runtime's
// metrics registry of this process (0 if it has not counted yet).
func Counter(name, label, value string) (float64, error) {
	m, err := metric(name, label, value)
	return m.GetCounter().GetValue(), err
}

// HistogramSum reads the sum of the histogram name{label="value"} from
// controller-runtime's metrics registry of this process (0 if it has not
// observed anything yet).
func HistogramSum(name, label, value string) (float64, error) {
	m, err := metric(name, label, value)
	return m.GetHistogram().GetSampleSum(), err
}

// CounterOf reads the counter name whose labels include every one of
// labels from controller-runtime's metrics registry of this process (0 if
// it has not counted yet).
func CounterOf(name string, labels map[string]string) (float64, error) {
	m, err := metricOf(name, labels)
	return m.GetCounter().GetValue(), err
}

// metric finds the series name{label="value"} in controller-runtime's
// metrics registry of this process (nil if there is none yet).
func metric(name, label, value string) (*dto.Metric, error) {
	return metricOf(name, map[string]string{label: value})
}

// metricOf finds the first series name whose labels include every one of
// labels (nil if there is none yet).
func metricOf(name string, labels map[string]string) (*dto.Metric, error) {
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		return nil, err
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			matched := 0
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v == l.GetValue() {
					matched++
				}
			}
			if matched == len(labels) {
				return m, nil
			}
		}
	}
	return nil, nil
}
