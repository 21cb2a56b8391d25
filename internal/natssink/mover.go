package natssink

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/student-bridge/student-bridge/sink"
)

// Mover moves a connection to another server of its cluster when no write
// (a publish, a record) through it has succeeded for a while although the
// connection is up. A server cut off from the rest of its cluster still
// accepts clients, and the client's pings still succeed; only its answers
// (timeouts, "no responders", conflicts from a leader that lost its
// quorum and does not know it yet) tell. Moving lets the bridge publish
// through the majority instead of waiting for the partition to heal.
type Mover struct {
	nc    *nats.Conn
	after time.Duration

	mu           sync.Mutex
	failingSince time.Time // the first failure since the last success
	moved        time.Time // the last move
}

// NewMover returns a Mover of nc that moves after failures for after.
func NewMover(nc *nats.Conn, after time.Duration) *Mover {
	return &Mover{nc: nc, after: after}
}

// Observe notes the outcome of one write (nil: it was stored) and returns
// err, saying so if the connection moves now. A nil Mover does nothing.
func (m *Mover) Observe(err error) error {
	if m == nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	switch {
	case err == nil:
		m.failingSince = time.Time{}
		return nil
	case !m.nc.IsConnected(), errors.Is(err, sink.ErrTooLarge):
		// Reconnecting already, or the request can never succeed.
		return err
	case m.failingSince.IsZero():
		m.failingSince = now
	}
	if now.Sub(m.failingSince) < m.after || now.Sub(m.moved) < m.after {
		return err
	}
	server := m.nc.ConnectedServerName()
	if m.nc.ForceReconnect() != nil {
		return err
	}
	failing := now.Sub(m.failingSince)
	m.moved, m.failingSince = now, time.Time{}
	return fmt.Errorf("%w (nothing succeeded on NATS server %s for %s: moving to another server)", err, server, failing.Round(100*time.Millisecond))
}
