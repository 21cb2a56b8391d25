package natssink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ack is JetStream's answer to a publish: where the message is stored,
// or, in Error, why it is not.
type ack struct {
	Stream    string              `json:"stream"`
	Seq       uint64              `json:"seq"`
	Duplicate bool                `json:"duplicate,omitempty"`
	Count     int                 `json:"count,omitempty"` // an atomic batch's messages
	Error     *jetstream.APIError `json:"error,omitempty"`
}

// publishJS publishes m to JetStream and waits for its answer, as
// nats.go's jetstream PublishMsg does, with the same errors: a "no
// responders" answer (a stream between leaders) is tried again twice,
// 250 ms apart; an error answer is a *jetstream.APIError. The tries
// together wait at most timeout, and no longer than ctx. The answer is
// read by readAck, not by reflection: three of them per change, each
// decoded by encoding/json, were a few per cent of the bridge's CPU.
// stream is the name of the stream expected to answer (read without a
// copy when it is that one).
func (rs *requests) publishJS(ctx context.Context, m *nats.Msg, stream string, timeout time.Duration) (ack, error) {
	deadline := time.Now().Add(timeout)
	resp, err := rs.do(ctx, m, timeout)
	for try := 0; errors.Is(err, nats.ErrNoResponders) && try < jetstream.DefaultPubRetryAttempts; try++ {
		wait := time.NewTimer(jetstream.DefaultPubRetryWait)
		select {
		case <-ctx.Done():
			wait.Stop()
		case <-wait.C:
		}
		resp, err = rs.do(ctx, m, time.Until(deadline))
	}
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return ack{}, jetstream.ErrNoStreamResponse
	case err != nil:
		return ack{}, err
	}
	a, err := readAck(resp.Data, stream)
	switch {
	case err != nil:
		return ack{}, fmt.Errorf("%w: %q", jetstream.ErrInvalidJSAck, resp.Data)
	case a.Error != nil:
		return ack{}, fmt.Errorf("nats: %w", a.Error)
	case a.Stream == "":
		return ack{}, fmt.Errorf("%w: %q", jetstream.ErrInvalidJSAck, resp.Data)
	}
	return a, nil
}

// readAck decodes JetStream's answer to a publish. The answer for a
// stored message is a flat object that scanAck reads; anything else (an
// error answer, an escaped string, a field it does not know) goes to
// encoding/json.
func readAck(data []byte, stream string) (ack, error) {
	if a, ok := scanAck(data, stream); ok {
		return a, nil
	}
	var a ack
	err := json.Unmarshal(data, &a)
	return a, err
}

// scanAck reads data as a JSON object without white space whose keys are
// among stream, seq, duplicate, count, domain and batch, each once, and
// whose values are what the server sends: strings without escapes,
// unsigned integers, booleans. ok is false for anything else. stream, the
// name expected, is used rather than a copy when it is the one named.
func scanAck(data []byte, stream string) (a ack, ok bool) {
	i := 0
	next := func(c byte) bool {
		if i < len(data) && data[i] == c {
			i++
			return true
		}
		return false
	}
	str := func() ([]byte, bool) {
		if !next('"') {
			return nil, false
		}
		start := i
		for ; i < len(data) && data[i] != '"'; i++ {
			if c := data[i]; c == '\\' || c < 0x20 || c >= 0x80 {
				return nil, false
			}
		}
		return data[start:i], next('"')
	}
	number := func(digits int) (uint64, bool) {
		start := i
		var n uint64
		for ; i < len(data) && data[i] >= '0' && data[i] <= '9'; i++ {
			n = n*10 + uint64(data[i]-'0')
		}
		return n, i > start && i-start <= digits && (data[start] != '0' || i-start == 1)
	}
	literal := func(word string) bool {
		if len(data)-i >= len(word) && string(data[i:i+len(word)]) == word {
			i += len(word)
			return true
		}
		return false
	}
	var seen uint8 // a bit per key: each once
	once := func(bit uint8) bool {
		ok := seen&bit == 0
		seen |= bit
		return ok
	}
	if !next('{') {
		return ack{}, false
	}
	for first := true; !next('}'); first = false {
		if !first && !next(',') {
			return ack{}, false
		}
		key, ok := str()
		if !ok || !next(':') {
			return ack{}, false
		}
		switch string(key) {
		case "stream":
			var v []byte
			v, ok = str()
			if a.Stream = stream; string(v) != stream {
				a.Stream = string(v)
			}
			ok = ok && once(1)
		case "seq":
			a.Seq, ok = number(19) // fits uint64
			ok = ok && once(2)
		case "count":
			var n uint64
			n, ok = number(18) // fits int
			a.Count = int(n)
			ok = ok && once(4)
		case "duplicate":
			a.Duplicate = literal("true")
			ok = (a.Duplicate || literal("false")) && once(8)
		case "domain":
			_, ok = str()
			ok = ok && once(16)
		case "batch":
			_, ok = str()
			ok = ok && once(32)
		default:
			return ack{}, false
		}
		if !ok {
			return ack{}, false
		}
	}
	return a, i == len(data)
}
