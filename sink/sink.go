// Package sink defines where the bridge sends CloudEvents (Sink) and where it
// remembers what it published (Store). The reconciler depends on these
// interfaces only; the NATS implementations (internal/natssink) are wired by cmd.
//
// It is the bridge's implementation, not part of the module's public API
// (api/v1, api/contract and consumer): it may change in any release.
package sink

import (
	"context"
	"errors"

	cloudevents "github.com/cloudevents/sdk-go/v2"
)

// Sentinel errors a Sink wraps, so callers can tell failures apart with
// errors.Is.
var (
	// ErrClosed: the sink or its connection was closed.
	ErrClosed = errors.New("sink: closed")
	// ErrNotConnected: the broker is unreachable right now; retry later.
	ErrNotConnected = errors.New("sink: not connected")
	// ErrTooLarge: the encoded event exceeds the broker's maximum payload.
	// Retrying the same event will not help.
	ErrTooLarge = errors.New("sink: event too large")
	// ErrUnavailable: the broker is reachable but cannot store the event
	// now (a JetStream cluster electing a leader or without a quorum, or an
	// earlier copy of the event still in flight); retry later.
	ErrUnavailable = errors.New("sink: broker unavailable")
	// ErrRejected: the broker refused the event (for example a full stream
	// that discards new messages, or a permissions violation).
	ErrRejected = errors.New("sink: rejected by broker")
)

// Receipt is what the broker said when it accepted an event.
type Receipt struct {
	// Subject is the NATS subject the event was published on.
	Subject string
	// Stream is the JetStream stream that stored the event; empty on core NATS.
	Stream string
	// Sequence is the stream sequence of the event; 0 on core NATS.
	Sequence uint64
	// Duplicate is true when the broker had already stored an event with the
	// same id within its duplicate window and dropped this copy.
	Duplicate bool
}

// Sink publishes CloudEvents.
type Sink interface {
	// Publish sends the event and returns nil only once the broker has
	// accepted it. Publish is safe for concurrent use.
	Publish(ctx context.Context, event cloudevents.Event) (Receipt, error)
}
