package natssink

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
)

// Classify is the publisher's classifier, for the tests.
func (p *Publisher) Classify(subject string, err error) error {
	return p.classify(context.Background(), subject, err)
}

// ClassifyRecordError is the record store's classifier on nc, for the tests.
func ClassifyRecordError(nc *nats.Conn, op string, err error) error {
	return (&KV{nc: nc}).classify(op, err)
}

// Requests sends requests on a connection, as the publisher and the
// record store do, for the tests.
type Requests = requests

// NewRequests is newRequests, for the tests.
func NewRequests(nc *nats.Conn) *Requests { return newRequests(nc) }

// Do is do, for the tests.
func (rs *requests) Do(ctx context.Context, m *nats.Msg, timeout time.Duration) (*nats.Msg, error) {
	return rs.do(ctx, m, timeout)
}
