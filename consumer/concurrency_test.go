//go:build !nostack

package consumer_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/student-bridge/student-bridge/consumer"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// blockingHandler blocks the changes of one Student until released, and
// records for every Student the schools it was handed, and whether two of
// one Student's changes were ever in the handler at once.
type blockingHandler struct {
	slow    string
	release chan struct{}

	mu       sync.Mutex
	inFlight map[string]int
	overlap  []string
	schools  map[string][]string
}

func (h *blockingHandler) handle(ctx context.Context, c consumer.Change) error {
	h.mu.Lock()
	h.inFlight[c.UID]++
	if h.inFlight[c.UID] > 1 {
		h.overlap = append(h.overlap, c.Name)
	}
	if c.New != nil {
		h.schools[c.Name] = append(h.schools[c.Name], c.New.Spec.School)
	}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.inFlight[c.UID]--
		h.mu.Unlock()
	}()
	if c.Name == h.slow {
		select {
		case <-h.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (h *blockingHandler) handed(name string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.schools[name])
}

// TestMirrorHandlesStudentsAtOnce: while one Student's handler is blocked,
// the other Students' changes, published after the blocked Student's
// later updates, are applied and their receipts written. The blocked
// Student's later updates wait for its handler to return (never two of its
// changes in the handler at once) and then come as one change, its newest.
func TestMirrorHandlesStudentsAtOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "atonce")
	h := &blockingHandler{slow: "slow", release: make(chan struct{}), inFlight: map[string]int{}, schools: map[string][]string{}}
	m, _ := w.mirror(t, "roster", h.handle, func(o *consumer.MirrorOptions) { o.Concurrency = 4 })
	w.waitAcked(t, "roster", 0)

	slow := w.create(t, "slow", "china")
	stacktest.WaitFor(t, "slow's first change in the handler", func() error {
		if len(h.handed("slow")) == 0 {
			return fmt.Errorf("not handed over yet")
		}
		return nil
	})
	w.update(t, slow, "peking")
	w.update(t, slow, "tsinghua")
	// More Students than handlers: they share the free ones.
	for i := range 8 {
		s := w.create(t, fmt.Sprintf("other-%d", i), "china")
		w.update(t, s, "fudan")
		w.waitReceipt(t, "roster", s, applied(w.lastID(s)))
	}
	if got := h.handed("slow"); !slices.Equal(got, []string{"china"}) {
		t.Errorf("while its first change was in the handler, slow was handed %v; want only [china]", got)
	}
	close(h.release)
	stacktest.WaitFor(t, "slow applied at its newest state", func() error {
		if d, ok := m.State()[string(slow.UID)]; !ok || d.Spec.School != "tsinghua" {
			return fmt.Errorf("slow applied: %+v", d)
		}
		return nil
	})
	w.waitReceipt(t, "roster", slow, applied(w.lastID(slow)))
	if got := h.handed("slow"); !slices.Equal(got, []string{"china", "tsinghua"}) {
		t.Errorf("slow was handed %v; want [china tsinghua]: its updates coalesced after its handler returned", got)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.overlap) > 0 {
		t.Errorf("two changes of one Student were in the handler at once: %v", h.overlap)
	}
}
