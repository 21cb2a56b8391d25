package natssink

import (
	"context"

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
