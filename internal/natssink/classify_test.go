//go:build !nostack

package natssink_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/sink"
)

// TestClassify: each error JetStream answers a publish or a record write
// with is named for what the caller can do. The API errors are the
// server's own (code and description as nats-server sends them).
func TestClassify(t *testing.T) {
	_, nc := server(t, nil)
	p, err := natssink.NewPublisher(nc, natssink.Config{Layout: layout(t)})
	if err != nil {
		t.Fatal(err)
	}
	apiErr := func(code jetstream.ErrorCode, status int, description string) error {
		return fmt.Errorf("publish: %w", &jetstream.APIError{Code: status, ErrorCode: code, Description: description})
	}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"JetStream without a meta leader", apiErr(10008, 503, "JetStream system temporarily unavailable"), sink.ErrUnavailable},
		{"expected sequences not known yet (a new leader)", apiErr(10163, 503, "expected last sequence per subject temporarily unavailable"), sink.ErrUnavailable},
		{"an earlier copy of the event in flight", apiErr(10158, 409, "duplicate message id is in process"), sink.ErrUnavailable},
		{"a full stream that discards new", apiErr(10077, 503, "maximum messages exceeded"), sink.ErrRejected},
		{"a wrong expected stream", apiErr(10060, 400, "expected stream does not match"), sink.ErrRejected},
		{"too large for the server", nats.ErrMaxPayload, sink.ErrTooLarge},
		{"a closed connection", nats.ErrConnectionClosed, sink.ErrClosed},
		// Answered while the connection was down, classified once it is
		// back: the error alone must say so.
		{"a disconnect, reconnected since", nats.ErrDisconnected, sink.ErrNotConnected},
		{"a reconnect under way, reconnected since", nats.ErrConnectionReconnecting, sink.ErrNotConnected},
		{"the reconnect buffer full, reconnected since", nats.ErrReconnectBufExceeded, sink.ErrNotConnected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.Classify("student.created", tc.err); !errors.Is(got, tc.want) {
				t.Errorf("publish: %v, want %v", got, tc.want)
			}
			if got := natssink.ClassifyRecordError(nc, "put k", tc.err); !errors.Is(got, tc.want) {
				t.Errorf("record write: %v, want %v", got, tc.want)
			}
		})
	}
}

// TestClassifyCoreFlushTimeout: on core NATS a flush that timed out has no
// stream to ask about; it stays an error of its own, not a panic.
func TestClassifyCoreFlushTimeout(t *testing.T) {
	_, nc := server(t, nil)
	p, err := natssink.NewPublisher(nc, natssink.Config{Layout: layout(t), Mode: natssink.Core})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Classify("student.created", context.DeadlineExceeded); errors.Is(got, sink.ErrRejected) || !errors.Is(got, context.DeadlineExceeded) {
		t.Errorf("core flush timeout: %v", got)
	}
}
