package natssink

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// requests sends requests on one connection and waits for their answers,
// as nats.go's Conn.RequestMsgWithContext does: the answers come to one
// wildcard subscription on an inbox of the connection's, each request's
// to a subject of its own under it. What a request needs is used again
// once its answer came: its answer subject, its channel and the timer
// that bounds it, which takes the place of a context.WithTimeout of its
// own. nats.go's makes the subject
// and the channel anew for every request, and the context added five
// allocations more: with three requests per change, about a quarter of a
// change's allocations.
type requests struct {
	nc *nats.Conn

	mu      sync.Mutex
	inbox   string             // the subscription's subject without its last token
	sub     *nats.Subscription // nil before the first request, and after it closed
	waiting map[string]*request
	idle    []*request // answered: no answer can still come to them
	made    uint64     // requests made: names the next answer subject
}

// request is what one request waits on.
type request struct {
	sub   *nats.Subscription // the subscription its subject is under
	reply string
	// answer gets the answer, or nil when the subscription closed. One
	// of either, never more: buffered, so it never holds up the
	// subscription.
	answer chan *nats.Msg
	timer  *time.Timer // stopped unless a request waits on it
}

func newRequests(nc *nats.Conn) *requests {
	return &requests{nc: nc, waiting: map[string]*request{}}
}

// do sends m and returns its answer, with RequestMsgWithContext's errors:
// ctx.Err() once ctx ends, context.DeadlineExceeded once timeout passed,
// nats.ErrNoResponders when nothing listens on m's subject,
// nats.ErrConnectionClosed or nats.ErrDisconnected when the connection
// closed while m waited. m's reply subject is set to the request's.
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

// start registers a request, subscribing to the answers first if no
// subscription is open.
func (rs *requests) start() (*request, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.sub == nil {
		inbox := rs.nc.NewInbox()
		sub, err := rs.nc.Subscribe(inbox+".*", rs.answered)
		if err != nil {
			return nil, err
		}
		// Called once the subscription's deliveries ended: after the
		// last answer it delivered.
		sub.SetClosedHandler(func(string) { rs.closed(sub) })
		if !sub.IsValid() { // closed before the handler was set
			return nil, nats.ErrConnectionClosed
		}
		rs.inbox, rs.sub = inbox, sub
		rs.idle = nil // their subjects are under the closed one's inbox
	}
	var r *request
	if n := len(rs.idle); n > 0 {
		r, rs.idle = rs.idle[n-1], rs.idle[:n-1]
	} else {
		rs.made++
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		r = &request{sub: rs.sub, reply: rs.inbox + "." + strconv.FormatUint(rs.made, 36), answer: make(chan *nats.Msg, 1), timer: timer}
	}
	rs.waiting[r.reply] = r
	return r, nil
}

// answered hands an answer to the request it is for. An answer for no
// request (one abandoned) is dropped.
func (rs *requests) answered(m *nats.Msg) {
	rs.mu.Lock()
	r := rs.waiting[m.Subject]
	delete(rs.waiting, m.Subject)
	rs.mu.Unlock()
	if r != nil {
		r.answer <- m
	}
}

// closed tells every request still waiting that sub closed (the
// connection closed or drained), and lets the next request subscribe
// again. Until sub closed no other subscription was made: every request
// waiting is one of sub's.
func (rs *requests) closed(sub *nats.Subscription) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.sub != sub {
		return
	}
	rs.sub, rs.idle = nil, nil
	for reply, r := range rs.waiting {
		delete(rs.waiting, reply)
		r.answer <- nil
	}
}

// abandon takes back a request that will not wait for its answer. If the
// subscription took the answer already, it is on its way: it is read, and
// the request used again. Otherwise the answer may still come (a late
// ack): the request's subject is never used again, so that no later
// request takes that answer for its own.
func (rs *requests) abandon(r *request) {
	rs.mu.Lock()
	_, waiting := rs.waiting[r.reply]
	delete(rs.waiting, r.reply)
	rs.mu.Unlock()
	if !waiting {
		<-r.answer
		rs.reuse(r)
	}
}

// reuse keeps r for a later request, unless its subject is under a
// subscription that closed.
func (rs *requests) reuse(r *request) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if r.sub == rs.sub {
		rs.idle = append(rs.idle, r)
	}
}
