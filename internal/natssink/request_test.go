//go:build !nostack

package natssink_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/student-bridge/student-bridge/internal/natssink"
)

// respond answers every request on subject with what answer returns,
// each in a goroutine of its own (answers go out in any order); it
// returns the reply subjects the requests came with.
func respond(t *testing.T, nc *nats.Conn, subject string, answer func(data []byte) []byte) func() map[string]int {
	t.Helper()
	var mu sync.Mutex
	replies := map[string]int{}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		mu.Lock()
		replies[m.Reply]++
		mu.Unlock()
		go func() { _ = m.Respond(answer(m.Data)) }()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return replies
	}
}

// TestRequestsAnswerTheirOwn: requests sent together, answered in any
// order, each get their own answer; and a request's subject is used
// again once answered, so that as many subjects serve them as requests
// waited at once.
func TestRequestsAnswerTheirOwn(t *testing.T) {
	_, nc := server(t, nil)
	replies := respond(t, nc, "echo", func(data []byte) []byte {
		time.Sleep(time.Duration(len(data)%3) * time.Millisecond) // some overtake others
		return data
	})
	rs := natssink.NewRequests(nc)
	const senders, each = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, senders*each)
	for s := range senders {
		wg.Go(func() {
			for i := range each {
				want := fmt.Sprintf("%d-%d-%s", s, i, make([]byte, i%5))
				got, err := rs.Do(context.Background(), &nats.Msg{Subject: "echo", Data: []byte(want)}, 10*time.Second)
				switch {
				case err != nil:
					errs <- err
				case string(got.Data) != want:
					errs <- fmt.Errorf("request %q got the answer %q", want, got.Data)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := len(replies()); n > senders {
		t.Errorf("%d requests, at most %d at once, came with %d reply subjects: answered ones are not used again", senders*each, senders, n)
	}
}

// TestRequestsLateAnswerGoesNowhere: a request that gave up (its timeout
// passed) may still be answered; that answer goes to no later request.
func TestRequestsLateAnswerGoesNowhere(t *testing.T) {
	_, nc := server(t, nil)
	respond(t, nc, "slow", func(data []byte) []byte {
		time.Sleep(300 * time.Millisecond)
		return data
	})
	rs := natssink.NewRequests(nc)
	ctx := context.Background()
	if _, err := rs.Do(ctx, &nats.Msg{Subject: "slow", Data: []byte("late")}, 20*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a request past its timeout: %v, want %v", err, context.DeadlineExceeded)
	}
	// Waiting while the late answer comes.
	got, err := rs.Do(ctx, &nats.Msg{Subject: "slow", Data: []byte("mine")}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Data) != "mine" {
		t.Errorf("the next request got %q, the answer to one that gave up", got.Data)
	}
}

// TestRequestsErrors: RequestMsgWithContext's errors: nobody listening,
// a context that ended before or while the request waited, and a
// connection closed while it waited.
func TestRequestsErrors(t *testing.T) {
	_, nc := server(t, nil)
	respond(t, nc, "never", func(data []byte) []byte {
		time.Sleep(time.Hour)
		return nil
	})
	rs := natssink.NewRequests(nc)
	if _, err := rs.Do(context.Background(), &nats.Msg{Subject: "nobody"}, 10*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("a request nobody listens to: %v, want %v", err, nats.ErrNoResponders)
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := rs.Do(ended, &nats.Msg{Subject: "never"}, 10*time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("a request with its context ended: %v, want %v", err, context.Canceled)
	}
	ending, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, err := rs.Do(ending, &nats.Msg{Subject: "never"}, time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("a request whose context ended while it waited: %v, want %v", err, context.Canceled)
	}
	time.AfterFunc(50*time.Millisecond, nc.Close)
	if _, err := rs.Do(context.Background(), &nats.Msg{Subject: "never"}, time.Minute); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Errorf("a request whose connection closed while it waited: %v, want %v", err, nats.ErrConnectionClosed)
	}
}
