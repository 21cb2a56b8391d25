package stack

import (
	"io"
	"net"
	"sync"
	"time"
)

// Link is a TCP proxy that carries connections to one address (the route
// from one NATS server of a cluster to another, a client's connection to
// the kube-apiserver). It can delay what it carries, as a slow network
// does, or cut it, as a partition does: a cut closes the connections it
// carries and refuses new ones until Heal.
type Link struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	delay time.Duration
	cut   bool
	conns map[net.Conn]struct{}
}

// NewLink starts a link that carries connections to target (host:port).
func NewLink(target string) (*Link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &Link{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go l.accept()
	return l, nil
}

// Addr is where the link listens, host:port.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// SetDelay delays every chunk the link carries from now on by d.
func (l *Link) SetDelay(d time.Duration) {
	l.mu.Lock()
	l.delay = d
	l.mu.Unlock()
}

// Cut closes what the link carries and refuses connections until Heal.
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = true
	for c := range l.conns {
		_ = c.Close()
	}
}

// Heal lets the link carry connections again.
func (l *Link) Heal() {
	l.mu.Lock()
	l.cut = false
	l.mu.Unlock()
}

// Close stops the link.
func (l *Link) Close() {
	_ = l.ln.Close()
	l.Cut()
}

func (l *Link) accept() {
	for {
		in, err := l.ln.Accept()
		if err != nil {
			return
		}
		go l.carry(in)
	}
}

// carry connects in to the target and copies both ways until either ends.
func (l *Link) carry(in net.Conn) {
	l.mu.Lock()
	cut := l.cut
	l.mu.Unlock()
	if cut {
		_ = in.Close()
		return
	}
	out, err := net.Dial("tcp", l.target)
	if err != nil {
		_ = in.Close()
		return
	}
	l.mu.Lock()
	if l.cut {
		l.mu.Unlock()
		_ = in.Close()
		_ = out.Close()
		return
	}
	l.conns[in], l.conns[out] = struct{}{}, struct{}{}
	l.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { l.copy(out, in); done <- struct{}{} }()
	go func() { l.copy(in, out); done <- struct{}{} }()
	<-done
	_ = in.Close()
	_ = out.Close()
	<-done
	l.mu.Lock()
	delete(l.conns, in)
	delete(l.conns, out)
	l.mu.Unlock()
}

// copy writes what src sends to dst, each chunk once the link's delay at
// the time it was read has passed, in order.
func (l *Link) copy(dst io.Writer, src io.Reader) {
	type chunk struct {
		due  time.Time
		data []byte
	}
	queue := make(chan chunk, 4096)
	go func() {
		defer close(queue)
		for {
			buf := make([]byte, 32*1024)
			n, err := src.Read(buf)
			if n > 0 {
				l.mu.Lock()
				d := l.delay
				l.mu.Unlock()
				queue <- chunk{due: time.Now().Add(d), data: buf[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range queue {
		time.Sleep(time.Until(c.due))
		if _, err := dst.Write(c.data); err != nil {
			for range queue { // let the reader end
			}
			return
		}
	}
}
