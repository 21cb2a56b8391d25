package natssink

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// requests sends requests on one connection and waits for their answers,
// as nats.go's Conn.RequestMsgWithContext does, with one goroutine fewer
// on an answer's way and less garbage.
//
// Each request has an answer subject of its own, subscribed with a
// channel: the connection's reader puts the answer in it, and the
// goroutine waiting on it runs next. nats.go's requests share one
// subscription with a handler, whose messages go through a goroutine of
// their own on their way (the reader wakes it, it wakes the waiting one).
// BenchmarkRequest measures the difference: 4 to 8 % of a request's CPU
// with requests 10 ms apart, with as many context switches (the extra
// goroutine mostly ran on the reader's thread). The price is a
// subscription per request in flight at once (at most about the
// workers'), where nats.go has one per connection.
//
// What a request needs is used again once its answer came: its subject
// with its subscription, its channels and the timer that bounds it, which
// takes the place of a context.WithTimeout of its own. nats.go's makes
// the subject and the channel anew for every request, and the context
// added five allocations more: with three requests per change, about a
// quarter of a change's allocations. A request that gave up ends its
// subscription, so that its late answer goes to no later request.
type requests struct {
	nc *nats.Conn

	mu   sync.Mutex
	idle []*request // answered: no answer can still come to them
}

// request is what one request waits on.
type request struct {
	sub   *nats.Subscription // on reply, delivering to answer
	reply string
	// answer gets the answer from the connection's reader. One request
	// has one answer (a JetStream ack or a no-responders status), and a
	// request uses its subject only once its last answer was read, so a
	// buffer of one is never full when an answer comes.
	answer chan *nats.Msg
	closed chan struct{} // closed when sub closed: no answer comes any more
	timer  *time.Timer   // stopped unless a request waits on it
}

func newRequests(nc *nats.Conn) *requests {
	return &requests{nc: nc}
}

// do sends m and returns its answer, with RequestMsgWithContext's errors:
// ctx.Err() once ctx ends, context.DeadlineExceeded once timeout passed,
// nats.ErrNoResponders when nothing listens on m's subject,
// nats.ErrConnectionClosed or nats.ErrDisconnected when the connection
// closed (or its subscription drained) while m waited. m's reply subject
// is set to the request's.
func (rs *requests) do(ctx context.Context, m *nats.Msg, timeout time.Duration) (*nats.Msg, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if timeout <= 0 {
		return nil, context.DeadlineExceeded
	}
	r, err := rs.start()
	if err != nil {
		return nil, err
	}
	m.Reply = r.reply
	if err := rs.nc.PublishMsg(m); err != nil {
		rs.abandon(r)
		return nil, err
	}
	r.timer.Reset(timeout)
	var answer *nats.Msg
	select {
	case answer = <-r.answer:
		r.timer.Stop()
		rs.reuse(r)
	case <-r.closed:
		r.timer.Stop()
		select {
		case answer = <-r.answer: // came before it closed
		default:
		}
	case <-r.timer.C:
		rs.abandon(r)
		return nil, context.DeadlineExceeded
	case <-ctx.Done():
		r.timer.Stop()
		rs.abandon(r)
		return nil, ctx.Err()
	}
	switch {
	case answer == nil && rs.nc.IsClosed():
		return nil, nats.ErrConnectionClosed
	case answer == nil:
		return nil, nats.ErrDisconnected
	case len(answer.Data) == 0 && answer.Header.Get("Status") == "503":
		return nil, nats.ErrNoResponders
	}
	return answer, nil
}

// start takes an idle request, or subscribes a new one.
func (rs *requests) start() (*request, error) {
	rs.mu.Lock()
	for n := len(rs.idle); n > 0; n = len(rs.idle) {
		r := rs.idle[n-1]
		rs.idle = rs.idle[:n-1]
		if r.sub.IsValid() {
			rs.mu.Unlock()
			return r, nil
		}
	}
	rs.mu.Unlock()
	r := &request{reply: rs.nc.NewInbox(), answer: make(chan *nats.Msg, 1), closed: make(chan struct{})}
	sub, err := rs.nc.ChanSubscribe(r.reply, r.answer)
	if err != nil {
		return nil, err
	}
	// Called when the subscription is unsubscribed, drained or its
	// connection closed.
	closed := sync.OnceFunc(func() { close(r.closed) })
	sub.SetClosedHandler(func(string) { closed() })
	if !sub.IsValid() { // closed before the handler was set
		return nil, nats.ErrConnectionClosed
	}
	r.sub = sub
	r.timer = time.NewTimer(time.Hour)
	r.timer.Stop()
	return r, nil
}

// abandon takes back a request that will not wait for its answer. The
// answer may still come (a late ack): the request's subscription ends, so
// that no later request takes that answer for its own.
func (rs *requests) abandon(r *request) {
	_ = r.sub.Unsubscribe()
}

// reuse keeps r for a later request.
func (rs *requests) reuse(r *request) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.idle = append(rs.idle, r)
}
