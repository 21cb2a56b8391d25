package shards_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/student-bridge/student-bridge/internal/shards"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

var st *stack.Stack

func TestMain(m *testing.M) {
	os.Exit(stacktest.RunTests(m, stack.Options{}, func(s *stack.Stack) { st = s }))
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

func startReplica(t *testing.T, name, id string, count int, opts ...func(*shards.Options)) *replica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	o := shards.Options{Client: st.Client, Namespace: "default", Name: name, Count: count, Identity: id,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond,
		Load: func(context.Context, []int) error { return nil }, Enqueue: func(context.Context, []int) {}, Log: logr.Discard()}
	for _, opt := range opts {
		opt(&o)
	}
	m := shards.New(o)
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
	if err := stacktest.Eventually(30*time.Second, func() error {
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

// leaseClient is a client of the test API server that counts the Lease
// writes and reads of one Lease made through it, and fails every call
// once cut.
type leaseClient struct {
	client.Client
	writes, gets atomic.Int64
	cut          atomic.Bool
}

func newLeaseClient(t *testing.T) *leaseClient {
	t.Helper()
	base, err := client.NewWithWatch(st.RestConfig, client.Options{Scheme: st.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	c := &leaseClient{}
	refuse := func() error {
		if c.cut.Load() {
			return errors.New("cut off from the API server")
		}
		return nil
	}
	write := func() error {
		if err := refuse(); err != nil {
			return err
		}
		c.writes.Add(1)
		return nil
	}
	c.Client = interceptor.NewClient(base, interceptor.Funcs{
		Get: func(ctx context.Context, inner client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if err := refuse(); err != nil {
				return err
			}
			c.gets.Add(1)
			return inner.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := refuse(); err != nil {
				return err
			}
			return c.List(ctx, list, opts...)
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if err := write(); err != nil {
				return err
			}
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if err := write(); err != nil {
				return err
			}
			return c.Update(ctx, obj, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if err := write(); err != nil {
				return err
			}
			return c.Delete(ctx, obj, opts...)
		},
	})
	return c
}

func withClient(c client.Client) func(*shards.Options) {
	return func(o *shards.Options) { o.Client = c }
}

// TestIdleWritesOneLeasePerReplica: at rest, replicas renew only their
// member Lease, once every LeaseDuration - RenewDeadline, whatever the
// number of shards: three replicas over 16 shards write about 3 Leases a
// second here (a Lease renewed per shard and retry period would be 38).
// A renewal writes the Lease as the replica last wrote it, without
// reading it first.
func TestIdleWritesOneLeasePerReplica(t *testing.T) {
	name := fmt.Sprintf("idle-%d", time.Now().UnixNano()%100000)
	c := newLeaseClient(t)
	// Renewed every second, read every 100 ms.
	timing := func(o *shards.Options) {
		o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = 3*time.Second, 2*time.Second, 100*time.Millisecond
	}
	rs := []*replica{
		startReplica(t, name, "a", 16, withClient(c), timing),
		startReplica(t, name, "b", 16, withClient(c), timing),
		startReplica(t, name, "c", 16, withClient(c), timing),
	}
	waitShares(t, rs, 16, [2]int{5, 6}, [2]int{5, 6}, [2]int{5, 6})
	// A replica's steps run one after another: once each has renewed its
	// member Lease (a step's first write) after the shares settled, the
	// writes of the handovers before are done.
	settled := time.Now()
	stacktest.WaitFor(t, "every replica renewed after the shares settled", func() error {
		for _, id := range []string{"a", "b", "c"} {
			var l coordinationv1.Lease
			if err := st.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name + "-member-" + id}, &l); err != nil {
				return err
			}
			if l.Spec.RenewTime == nil || !l.Spec.RenewTime.After(settled) {
				return fmt.Errorf("%s last renewed at %v", id, l.Spec.RenewTime)
			}
		}
		return nil
	})
	before, gets, t0 := c.writes.Load(), c.gets.Load(), time.Now()
	time.Sleep(3 * time.Second) // the window the writes at rest are counted in
	writes, elapsed := c.writes.Load()-before, time.Since(t0)
	if gets := c.gets.Load() - gets; gets != 0 {
		t.Errorf("%d Leases read one by one at rest, want none (a renewal needs no read)", gets)
	}
	// Each replica renews at most once per second of the window, plus one
	// renewal due at its start.
	if limit := int64(len(rs)) * (int64(elapsed/time.Second) + 1); writes > limit {
		t.Errorf("%d Lease writes in %s at rest by %d replicas over 16 shards, want at most %d (one member Lease each per second)", writes, elapsed.Round(time.Millisecond), len(rs), limit)
	}
	waitShares(t, rs, 16, [2]int{5, 6}, [2]int{5, 6}, [2]int{5, 6})
}

// TestGracefulStopHandsOverWithinARetryPeriod: a replica that stops
// releases its shard Leases and deletes its member Lease, so that the
// others take its shards at their next retry, not once its Lease expired
// (a minute here).
func TestGracefulStopHandsOverWithinARetryPeriod(t *testing.T) {
	name := fmt.Sprintf("graceful-%d", time.Now().UnixNano()%100000)
	long := func(o *shards.Options) {
		o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = time.Minute, 40*time.Second, 200*time.Millisecond
	}
	a, b := startReplica(t, name, "a", 8, long), startReplica(t, name, "b", 8, long)
	waitShares(t, []*replica{a, b}, 8, [2]int{4, 4}, [2]int{4, 4})
	b.stop()
	t0 := time.Now()
	if err := stacktest.Eventually(20*time.Second, func() error {
		if n := len(a.m.Held()); n != 8 {
			return fmt.Errorf("a holds %d of 8 shards", n)
		}
		return nil
	}); err != nil {
		t.Fatalf("after b stopped (lease 1m, retry 200ms): %v", err)
	}
	t.Logf("a held every shard %s after b stopped", time.Since(t0).Round(time.Millisecond))
}

// TestGainedShardsLoadOnce: a replica that gains several shards in one
// step loads them in one go: alone at the start (8 shards), and when the
// other replica stops (its 4).
func TestGainedShardsLoadOnce(t *testing.T) {
	name := fmt.Sprintf("loadonce-%d", time.Now().UnixNano()%100000)
	var mu sync.Mutex
	var loads [][]int
	a := startReplica(t, name, "a", 8, func(o *shards.Options) {
		o.Load = func(_ context.Context, gained []int) error {
			mu.Lock()
			loads = append(loads, gained)
			mu.Unlock()
			return nil
		}
	})
	waitShares(t, []*replica{a}, 8, [2]int{8, 8})
	b := startReplica(t, name, "b", 8)
	waitShares(t, []*replica{a, b}, 8, [2]int{4, 4}, [2]int{4, 4})
	b.stop()
	waitShares(t, []*replica{a}, 8, [2]int{8, 8})
	mu.Lock()
	defer mu.Unlock()
	if len(loads) != 2 || len(loads[0]) != 8 || len(loads[1]) != 4 {
		t.Fatalf("loads of a: %v, want one of 8 shards, then one of the 4 b held", loads)
	}
}

// TestGiveUpWaitsForWorkInFlight: a replica gives a shard up (here: it
// stops) only once the reconciles in flight for it have ended; until
// then its Lease still names it.
func TestGiveUpWaitsForWorkInFlight(t *testing.T) {
	name := fmt.Sprintf("inflight-%d", time.Now().UnixNano()%100000)
	a := startReplica(t, name, "a", 2)
	waitShares(t, []*replica{a}, 2, [2]int{2, 2})
	key := types.NamespacedName{Namespace: "ns", Name: "s"}
	done, ok := a.m.Begin(key)
	if !ok {
		t.Fatal("a holds every shard but Begin refused")
	}
	stopped := make(chan struct{})
	go func() { a.stop(); close(stopped) }()
	lease := fmt.Sprintf("%s-shard-%d", name, a.m.Shard(key))
	// The stop has begun once Begin refuses new work; it releases the
	// shard with nothing in flight first, then waits for the reconcile in
	// flight before it gives up the other.
	other := types.NamespacedName{Namespace: "ns", Name: "other"}
	for a.m.Shard(other) == a.m.Shard(key) {
		other.Name += "x"
	}
	otherLease := fmt.Sprintf("%s-shard-%d", name, a.m.Shard(other))
	stacktest.WaitFor(t, "a giving the shard up", func() error {
		if done, ok := a.m.Begin(key); ok {
			done()
			return errors.New("a still begins work for the shard")
		}
		return nil
	})
	stacktest.WaitFor(t, "a's other shard released", func() error {
		if h := leaseHolder(t, otherLease); h != "" {
			return fmt.Errorf("its Lease names %q", h)
		}
		return nil
	})
	select {
	case <-stopped:
		t.Fatal("a stopped while a reconcile of its shard was in flight")
	default:
	}
	if h := leaseHolder(t, lease); h != "a" {
		t.Fatalf("while a reconcile is in flight the shard's Lease names %q, want a", h)
	}
	done()
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("a did not stop once the reconcile ended")
	}
	if h := leaseHolder(t, lease); h != "" {
		t.Errorf("after a stopped the shard's Lease names %q, want nobody", h)
	}
}

func leaseHolder(t *testing.T, name string) string {
	t.Helper()
	var l coordinationv1.Lease
	if err := st.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name}, &l); err != nil {
		t.Fatal(err)
	}
	return ptr.Deref(l.Spec.HolderIdentity, "")
}

// TestCutOffReplicaGivesUpItsShards: a replica that cannot reach the API
// server cannot renew its member Lease; it gives up its shards after the
// renew deadline, before its Lease expires, and the other replica takes
// them once it expired, and not before.
func TestCutOffReplicaGivesUpItsShards(t *testing.T) {
	name := fmt.Sprintf("cutoff-%d", time.Now().UnixNano()%100000)
	c := newLeaseClient(t)
	a, b := startReplica(t, name, "a", 4, withClient(c)), startReplica(t, name, "b", 4)
	waitShares(t, []*replica{a, b}, 4, [2]int{2, 2}, [2]int{2, 2})
	c.cut.Store(true)
	// Watched every 10 ms from the cut: when a let go of its last shard,
	// and when b first held more than its two.
	var gaveUp, took time.Time
	deadline := time.Now().Add(20 * time.Second)
	for (gaveUp.IsZero() || took.IsZero()) && time.Now().Before(deadline) {
		now := time.Now()
		if gaveUp.IsZero() && len(a.m.Held()) == 0 {
			gaveUp = now
		}
		if took.IsZero() && len(b.m.Held()) > 2 {
			took = now
		}
		time.Sleep(10 * time.Millisecond) // the sampling interval of the times measured
	}
	if gaveUp.IsZero() || took.IsZero() {
		t.Fatalf("20 s after the cut: a holds %v, b %v", a.m.Held(), b.m.Held())
	}
	var member coordinationv1.Lease
	if err := st.Client.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: name + "-member-a"}, &member); err != nil {
		t.Fatal(err)
	}
	renewed := member.Spec.RenewTime.Time
	expires := renewed.Add(time.Duration(*member.Spec.LeaseDurationSeconds) * time.Second)
	t.Logf("a last renewed its member Lease at %s; gave up its shards %s later, b took them %s later",
		renewed.Format("15:04:05.000"), gaveUp.Sub(renewed).Round(time.Millisecond), took.Sub(renewed).Round(time.Millisecond))
	if took.Before(expires) {
		t.Errorf("b took a's shards %s before a's member Lease expired", expires.Sub(took).Round(time.Millisecond))
	}
	if !gaveUp.Before(took) {
		t.Errorf("a gave up its shards %s after b took them: both held them meanwhile", gaveUp.Sub(took).Round(time.Millisecond))
	}
	waitShares(t, []*replica{a, b}, 4, [2]int{0, 0}, [2]int{4, 4})
	c.cut.Store(false)
	waitShares(t, []*replica{a, b}, 4, [2]int{2, 2}, [2]int{2, 2})
}

// TestHeldIsToldOfEveryChange: Held hears 0 at start, then each new
// number of shards held: all four alone, two once another replica shares,
// none once it stopped.
func TestHeldIsToldOfEveryChange(t *testing.T) {
	name := fmt.Sprintf("held-%d", time.Now().UnixNano()%100000)
	var mu sync.Mutex
	var told []int
	a := startReplica(t, name, "a", 4, func(o *shards.Options) {
		o.Held = func(n int) {
			mu.Lock()
			defer mu.Unlock()
			told = append(told, n)
		}
	})
	last := func(want int) func() error {
		return func() error {
			mu.Lock()
			defer mu.Unlock()
			if len(told) == 0 || told[len(told)-1] != want || told[0] != 0 {
				return fmt.Errorf("Held told %v, want 0 first and %d last", told, want)
			}
			for i := 1; i < len(told); i++ {
				if told[i] == told[i-1] {
					return fmt.Errorf("Held told %v: the same number twice in a row", told)
				}
			}
			return nil
		}
	}
	for _, step := range []struct {
		what string
		do   func()
		want int
	}{
		{"alone", func() {}, 4},
		{"shared", func() { startReplica(t, name, "b", 4) }, 2},
	} {
		step.do()
		if err := stacktest.Eventually(20*time.Second, last(step.want)); err != nil {
			t.Fatalf("%s: %v", step.what, err)
		}
	}
	a.stop()
	if err := last(0)(); err != nil {
		t.Fatalf("stopped: %v", err)
	}
}

// TestLostShardIsTakenAgain: a shard given up because a record write
// conflicted is not this replica's at once; its Lease still names this
// replica, so if nobody else holds it, the replica takes it again at its
// next retry (reloading its records).
func TestLostShardIsTakenAgain(t *testing.T) {
	name := fmt.Sprintf("lost-%d", time.Now().UnixNano()%100000)
	var loads atomic.Int32
	a := startReplica(t, name, "a", 2, func(o *shards.Options) {
		o.Load = func(context.Context, []int) error { loads.Add(1); return nil }
	})
	waitShares(t, []*replica{a}, 2, [2]int{2, 2})
	key := types.NamespacedName{Namespace: "ns", Name: "s"}
	before := loads.Load()
	returned := make(chan struct{})
	go func() { a.m.Lost(key); close(returned) }()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("Lost did not return")
	}
	if err := stacktest.Eventually(20*time.Second, func() error {
		if !a.m.Owns(key) || loads.Load() == before {
			return fmt.Errorf("shard %d not taken again (loads %d, before %d)", a.m.Shard(key), loads.Load(), before)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestLostShardAtTargetIsNotOrphaned: a replica whose record write
// conflicted gives the shard up; if it then holds exactly its fair share
// (here: a held all 3 shards, b just joined, a's target is 2), it still
// takes the shard back, because its Lease still names it and no one else
// may take it: then it releases its surplus, and b gets one. Before, the
// shard stayed with nobody publishing for it.
func TestLostShardAtTargetIsNotOrphaned(t *testing.T) {
	name := fmt.Sprintf("orphan-%d", time.Now().UnixNano()%100000)
	// a steps every 2s, so that b joins and a loses a shard between two
	// of its steps.
	a := startReplica(t, name, "a", 3, func(o *shards.Options) {
		o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = 5*time.Second, 3*time.Second, 2*time.Second
	})
	waitShares(t, []*replica{a}, 3, [2]int{3, 3})
	var key types.NamespacedName
	for i := 0; ; i++ {
		key = types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("s%d", i)}
		if a.m.Owns(key) {
			break
		}
	}
	b := startReplica(t, name, "b", 3, func(o *shards.Options) { o.RetryPeriod = 200 * time.Millisecond })
	a.m.Lost(key)
	waitShares(t, []*replica{a, b}, 3, [2]int{2, 2}, [2]int{1, 1})
}

// TestMemberLeaseLastsLeaseDuration: a replica's shards are free only once
// its member Lease was not renewed for LeaseDuration (docs/scaling.md),
// not RenewDeadline: read as another replica reads them, the Leases a
// replica wrote name it the holder of its shards until LeaseDuration after
// its last renewal, and nobody after.
func TestMemberLeaseLastsLeaseDuration(t *testing.T) {
	name := fmt.Sprintf("duration-%d", time.Now().UnixNano()%100000)
	const lease, renew = 8 * time.Second, 3 * time.Second
	a := startReplica(t, name, "a", 4, func(o *shards.Options) {
		o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = lease, renew, 100*time.Millisecond
	})
	waitShares(t, []*replica{a}, 4, [2]int{4, 4})
	var list coordinationv1.LeaseList
	if err := st.Client.List(context.Background(), &list, client.InNamespace("default"), client.MatchingLabels{shards.LabelBridge: name}); err != nil {
		t.Fatal(err)
	}
	var renewed time.Time
	for _, l := range list.Items {
		if l.Labels[shards.LabelRole] == shards.RoleMember && l.Spec.RenewTime != nil {
			renewed = l.Spec.RenewTime.Time
		}
	}
	if renewed.IsZero() {
		t.Fatalf("no renewed member Lease among %d Leases of %s", len(list.Items), name)
	}
	if held := shards.ShardHolders(list.Items, renewed.Add(lease-time.Second)); len(held) != 4 {
		t.Errorf("%s after the member Lease's last renewal, its Leases say %d of 4 shards are held (%v), want 4: "+
			"another replica would take them before LeaseDuration (%s)", lease-time.Second, len(held), held, lease)
	}
	if held := shards.ShardHolders(list.Items, renewed.Add(lease+time.Second)); len(held) != 0 {
		t.Errorf("%s after the member Lease's last renewal, its Leases still say shards %v are held, want none", lease+time.Second, held)
	}
}
