package shards_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/student-bridge/student-bridge/internal/shards"
	"github.com/student-bridge/student-bridge/internal/stack"
)

var st *stack.Stack

func TestMain(m *testing.M) {
	os.Exit(stack.RunTests(m, stack.Options{}, func(s *stack.Stack) { st = s }))
}

// TestOf: the documented hash, so a consumer or an operator can compute a
// Student's shard: FNV-1a 32 of "namespace/name" modulo the count.
func TestOf(t *testing.T) {
	for _, tc := range []struct {
		ns, name string
		count    int
		want     int
	}{
		// Expected values computed independently (Python, the FNV-1a
		// constants 0x811c9dc5 and 0x01000193).
		{"default", "object-name", 16, 12},
		{"default", "object-name", 1, 0},
		{"school-a", "wang", 16, 11},
	} {
		if got := shards.Of(tc.ns, tc.name, tc.count); got != tc.want {
			t.Errorf("Of(%s, %s, %d) = %d, want %d", tc.ns, tc.name, tc.count, got, tc.want)
		}
	}
}

// replica is a Manager run against the test API server.
type replica struct {
	m      *shards.Manager
	cancel context.CancelFunc
	done   chan struct{}
}

func startReplica(t *testing.T, name, id string, count int) *replica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	m := shards.New(shards.Options{Client: st.Client, Namespace: "default", Name: name, Count: count, Identity: id,
		LeaseDuration: 3 * time.Second, RetryPeriod: 500 * time.Millisecond,
		Load: func(context.Context, int) error { return nil }, Enqueue: func(context.Context, int) {}, Log: logr.Discard()})
	r := &replica{m: m, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(r.done); _ = m.Start(ctx) }()
	t.Cleanup(r.stop)
	return r
}

var stopOnce sync.Map

func (r *replica) stop() {
	if _, done := stopOnce.LoadOrStore(r, true); done {
		return
	}
	r.cancel()
	<-r.done
}

// waitShares waits until the replicas hold want shards each (in order)
// and no shard is held twice.
func waitShares(t *testing.T, rs []*replica, count int, want ...[2]int) {
	t.Helper()
	if err := stack.Eventually(30*time.Second, func() error {
		seen := map[int]int{}
		var got []int
		for _, r := range rs {
			held := r.m.Held()
			got = append(got, len(held))
			for _, n := range held {
				seen[n]++
			}
		}
		for n, c := range seen {
			if c > 1 {
				return fmt.Errorf("shard %d held by %d replicas", n, c)
			}
		}
		if len(seen) != count {
			return fmt.Errorf("%d of %d shards held (%v)", len(seen), count, got)
		}
		for i, w := range want {
			if got[i] < w[0] || got[i] > w[1] {
				return fmt.Errorf("replicas hold %v shards", got)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestSharesSettleAndMove: three replicas settle to 5-6 of 16 shards each;
// one stopped (its Leases released), the other two take all 16 at once;
// a new one joins, and they share again.
func TestSharesSettleAndMove(t *testing.T) {
	name := fmt.Sprintf("settle-%d", time.Now().UnixNano()%100000)
	a, b, c := startReplica(t, name, "a", 16), startReplica(t, name, "b", 16), startReplica(t, name, "c", 16)
	waitShares(t, []*replica{a, b, c}, 16, [2]int{5, 6}, [2]int{5, 6}, [2]int{5, 6})
	for n := range 16 {
		key := types.NamespacedName{Namespace: "ns", Name: fmt.Sprint(n)}
		owners := 0
		for _, r := range []*replica{a, b, c} {
			if r.m.Owns(key) {
				owners++
			}
		}
		if owners != 1 {
			t.Errorf("%s is owned by %d replicas", key, owners)
		}
	}
	c.stop()
	waitShares(t, []*replica{a, b}, 16, [2]int{8, 8}, [2]int{8, 8})
	d := startReplica(t, name, "d", 16)
	waitShares(t, []*replica{a, b, d}, 16, [2]int{5, 6}, [2]int{5, 6}, [2]int{5, 6})
}
