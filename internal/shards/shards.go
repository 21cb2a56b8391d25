// Package shards shares the Students out among active-active bridge
// replicas. There is a fixed number of shards; a Student's shard is a
// stable hash of its namespace/name (Of).
//
// Every replica announces itself with a member Lease, the only Lease it
// renews. Every shard has a Lease naming its holder, written only when the
// shard changes hands (a conditional update, so only one replica takes
// it): a shard is held while its holder's member Lease is live, and free
// once it expired or was deleted. A replica takes at most its fair share
// (shards / live replicas, one more for some) while others are live. So
// at rest N replicas write N Leases per renewal, whatever the number of
// shards, and a replica killed pauses its shards for at most the lease
// duration and a retry period, as with a Lease per shard.
package shards

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	shardsHeld = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "student_bridge_shards_held",
		Help: "Shards this replica holds (publishes for).",
	})
	shardCount = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "student_bridge_shards",
		Help: "Shards the Students are shared out by (shards.count); 0 without shards. Fewer held, summed over the replicas, means Students nobody publishes for.",
	})
	handovers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "student_bridge_shard_handovers_total",
		Help: "Shards this replica took (acquired) or gave up (released, lost), by kind.",
	}, []string{"kind"})
	loadDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "student_bridge_shard_load_duration_seconds",
		Help:    "How long loading the shards gained in one step took (their records, read from the record store), before they count as held.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
	})
	inFlight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "student_bridge_shard_reconciles_in_flight",
		Help: "Reconciles running now per shard held here; giving a shard up waits for it to reach 0. The backlog is student_bridge_shard_unpublished.",
	}, []string{"shard"})
)

var registerOnce sync.Once

// RegisterMetrics registers the shards' metrics with controller-runtime's
// registry, the one the bridge's manager serves; once per process.
func RegisterMetrics() {
	registerOnce.Do(func() {
		metrics.Registry.MustRegister(shardsHeld, shardCount, handovers, loadDuration, inFlight)
	})
}

// Of is the shard of the Student namespace/name among count shards: the
// 32-bit FNV-1a hash of "namespace/name", modulo count.
func Of(namespace, name string, count int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(namespace + "/" + name))
	return int(h.Sum32() % uint32(count))
}

// Labels on the Leases: which bridge they belong to (its
// leaderElection.id), and their role, RoleShard or RoleMember.
const (
	LabelBridge = "student-bridge.example.k8s.io/bridge"
	LabelRole   = "student-bridge.example.k8s.io/role"
	RoleShard   = "shard"
	RoleMember  = "member"
)

// annotationShard on a shard Lease holds its shard number.
const annotationShard = LabelRole + "-shard"

// Options configure a Manager.
type Options struct {
	// Client reads and writes Leases; it should not be a cache.
	Client client.Client
	// Namespace of the Leases; Name prefixes them: <Name>-shard-<n> and
	// <Name>-member-<identity>.
	Namespace, Name string
	Count           int
	// Identity names this replica (unique among the live ones).
	Identity string
	// LeaseDuration: a member Lease not renewed for this long is dead,
	// and its shards free. RenewDeadline: a replica that could not renew
	// its member Lease for this long gives up its shards before the others
	// may take them; it renews every LeaseDuration - RenewDeadline (2/3 of
	// LeaseDuration when RenewDeadline is not between RetryPeriod and
	// LeaseDuration). RetryPeriod: how often Leases are read and shards
	// contested.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Load prepares the shards this replica gained in one step (their
	// records), in one go for all of them; they count as held only once it
	// returned nil.
	Load func(ctx context.Context, shards []int) error
	// Enqueue queues the Students of shards this replica now holds.
	Enqueue func(ctx context.Context, shards []int)
	// Held, if set, is told how many shards this replica holds whenever
	// that changes (0 at start), e.g. to take its share of budgets that
	// are the whole bridge's.
	Held func(n int)
	Log  logr.Logger
}

// Manager holds this replica's shards.
type Manager struct {
	o Options

	mu       sync.Mutex
	idle     *sync.Cond
	owned    []bool
	inflight []int
	stopping bool // releaseAll began: no new work

	renewed time.Time // the member Lease's last successful renewal
	// member is the member Lease as this replica last wrote it: the next
	// renewal updates it without reading it first.
	member *coordinationv1.Lease

	notifyMu sync.Mutex
	notified int // the shards Held was last told of; -1 before the first
}

// New returns a Manager; add it to the controller manager to run it.
func New(o Options) *Manager {
	if o.RenewDeadline <= o.RetryPeriod || o.RenewDeadline >= o.LeaseDuration {
		o.RenewDeadline = o.LeaseDuration * 2 / 3
	}
	m := &Manager{o: o, owned: make([]bool, o.Count), inflight: make([]int, o.Count), notified: -1}
	m.idle = sync.NewCond(&m.mu)
	shardCount.Set(float64(o.Count))
	return m
}

// Shard is the shard of key.
func (m *Manager) Shard(key types.NamespacedName) int { return Of(key.Namespace, key.Name, m.o.Count) }

// Owns reports whether this replica holds key's shard.
func (m *Manager) Owns(key types.NamespacedName) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.owned[m.Shard(key)]
}

// Begin marks work on key in flight, if this replica holds its shard and
// is not stopping; done ends it. A shard is given up only once its work in
// flight ended.
func (m *Manager) Begin(key types.NamespacedName) (done func(), ok bool) {
	n := m.Shard(key)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.owned[n] || m.stopping {
		return nil, false
	}
	m.inflight[n]++
	inFlight.WithLabelValues(strconv.Itoa(n)).Set(float64(m.inflight[n]))
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.inflight[n]--
		inFlight.WithLabelValues(strconv.Itoa(n)).Set(float64(m.inflight[n]))
		m.idle.Broadcast()
	}, true
}

// Lost gives up key's shard at once, without waiting for its Lease: a
// record write conflicted, so another replica has taken it.
func (m *Manager) Lost(key types.NamespacedName) {
	n := m.Shard(key)
	m.mu.Lock()
	lost := m.owned[n]
	if lost {
		m.o.Log.Info("a record write conflicted: another replica holds the shard; giving it up", "shard", n)
		m.owned[n] = false
		handovers.WithLabelValues("lost").Inc()
	}
	m.mu.Unlock()
	if lost {
		m.notify() // it takes the lock
	}
}

// Held lists the shards held here.
func (m *Manager) Held() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.heldLocked()
}

func (m *Manager) heldLocked() []int {
	var out []int
	for n, o := range m.owned {
		if o {
			out = append(out, n)
		}
	}
	return out
}

// NeedLeaderElection is false: every replica contests shards.
func (m *Manager) NeedLeaderElection() bool { return false }

// Start contests shards until ctx is done, then gives up every shard
// (after its work in flight) and releases the Leases, so the other
// replicas take over within a retry period.
func (m *Manager) Start(ctx context.Context) error {
	m.notify() // nothing held yet
	tick := time.NewTicker(m.o.RetryPeriod)
	defer tick.Stop()
	for {
		if err := m.step(ctx); err != nil && ctx.Err() == nil {
			m.o.Log.Info("contesting shards failed; retrying", "reason", err.Error())
		}
		select {
		case <-ctx.Done():
			m.releaseAll()
			return nil
		case <-tick.C:
		}
	}
}

func (m *Manager) shardLease(n int) string { return fmt.Sprintf("%s-shard-%d", m.o.Name, n) }

func (m *Manager) memberLease() string { return m.o.Name + "-member-" + m.o.Identity }

func (m *Manager) step(ctx context.Context) error {
	now := time.Now()
	if err := m.renewMember(ctx, now); err != nil {
		if held := m.Held(); len(held) > 0 && now.Sub(m.renewed) > m.o.RenewDeadline {
			// The others may count this replica as gone soon, and take
			// its shards: stop publishing for them first.
			m.o.Log.Info("could not renew the member Lease within the renew deadline; giving up every shard", "shards", held, "reason", err.Error())
			for _, n := range held {
				m.giveUp(n, "lost")
			}
			m.notify()
		}
		return err
	}
	var list coordinationv1.LeaseList
	if err := m.o.Client.List(ctx, &list, client.InNamespace(m.o.Namespace), client.MatchingLabels{LabelBridge: m.o.Name}); err != nil {
		return fmt.Errorf("list Leases: %w", err)
	}
	members := liveMembers(list.Items, now)
	members[m.o.Identity] = true
	shards := map[int]*coordinationv1.Lease{}
	for i := range list.Items {
		l := &list.Items[i]
		if n, ok := shardOf(l); ok && n < m.o.Count {
			shards[n] = l
		}
	}
	// Every live replica has a target: count/live shards, one more for
	// the first count%live of them by identity. The targets add up to
	// count, so the shares settle without further coordination.
	ids := make([]string, 0, len(members))
	for id := range members {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	target := m.o.Count / len(ids)
	if sort.SearchStrings(ids, m.o.Identity) < m.o.Count%len(ids) {
		target++
	}

	// What another replica holds now is lost. What is held needs no
	// write: the member Lease renewed above keeps it.
	for _, n := range m.Held() {
		if l := shards[n]; l == nil || holder(l) != m.o.Identity {
			m.giveUp(n, "lost")
		}
	}
	// A shard whose Lease names this replica but which it gave up after a
	// record write conflicted is taken again (its records reloaded)
	// whatever the target: no other replica may take it while the Lease
	// names a live one, and the conflict may have been this replica's own
	// write, retried after a NATS leader election stored it, not another's.
	claimed := map[int]*coordinationv1.Lease{}
	for n := range m.o.Count {
		if l := shards[n]; l != nil && holder(l) == m.o.Identity && !m.owns(n) && m.claim(ctx, l, now) == nil {
			claimed[n] = l
		}
	}
	// More than the target: release the rest.
	held := m.Held()
	for i := 0; i < len(held)+len(claimed)-target && i < len(held); i++ {
		n := held[len(held)-1-i]
		m.giveUp(n, "released")
		if l := shards[n]; l != nil {
			l.Spec.HolderIdentity = ptr.To("")
			_ = m.o.Client.Update(ctx, l)
		}
	}
	// Take free or abandoned shards up to the fair share.
	for n := range m.o.Count {
		if len(m.Held())+len(claimed) >= target {
			break
		}
		l := shards[n]
		if l != nil && members[holder(l)] {
			continue // held by a live replica (this one included)
		}
		if l == nil {
			l = m.newShardLease(n)
		}
		if m.claim(ctx, l, now) == nil {
			claimed[n] = l
		}
	}
	m.takeOver(ctx, claimed)
	m.notify()
	return nil
}

// notify updates the metric and tells Held of the number of shards held,
// if it changed.
func (m *Manager) notify() {
	m.notifyMu.Lock()
	defer m.notifyMu.Unlock()
	n := len(m.Held())
	shardsHeld.Set(float64(n))
	if n != m.notified && m.o.Held != nil {
		m.o.Held(n)
	}
	m.notified = n
}

func (m *Manager) owns(n int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.owned[n]
}

// newShardLease is shard n's Lease, not yet created.
func (m *Manager) newShardLease(n int) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: m.o.Namespace, Name: m.shardLease(n),
		Labels:      map[string]string{LabelBridge: m.o.Name, LabelRole: RoleShard},
		Annotations: map[string]string{annotationShard: strconv.Itoa(n)}}}
}

// claim writes shard Lease l as held by this replica, conditionally on its
// resourceVersion (creating it if it has none): only one replica gets it.
func (m *Manager) claim(ctx context.Context, l *coordinationv1.Lease, now time.Time) error {
	m.fill(l, now, 0)
	if l.ResourceVersion == "" {
		return m.o.Client.Create(ctx, l)
	}
	return m.o.Client.Update(ctx, l) // fails if another replica was quicker
}

// takeOver loads the shards whose Leases were claimed, all in one Load,
// then holds them and queues their Students; if the load fails, it frees
// their Leases again.
func (m *Manager) takeOver(ctx context.Context, claimed map[int]*coordinationv1.Lease) {
	if len(claimed) == 0 {
		return
	}
	gained := make([]int, 0, len(claimed))
	for n := range claimed {
		gained = append(gained, n)
	}
	sort.Ints(gained)
	start := time.Now()
	err := m.o.Load(ctx, gained)
	loadDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		m.o.Log.Info("loading gained shards failed; releasing them", "shards", gained, "reason", err.Error())
		for _, l := range claimed {
			l.Spec.HolderIdentity = ptr.To("")
			_ = m.o.Client.Update(ctx, l)
		}
		return
	}
	m.mu.Lock()
	for _, n := range gained {
		m.owned[n] = true
	}
	m.mu.Unlock()
	handovers.WithLabelValues("acquired").Add(float64(len(gained)))
	m.o.Log.Info("holding shards", "shards", gained)
	go m.o.Enqueue(ctx, gained)
}

// fill makes l held by this replica at now: for dur seconds (a member
// Lease), or, with dur 0, for as long as its member Lease lives (a shard
// Lease: no duration of its own, renewTime is when it was taken).
func (m *Manager) fill(l *coordinationv1.Lease, now time.Time, dur int32) {
	if holder(l) != m.o.Identity {
		l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
		l.Spec.AcquireTime = &metav1.MicroTime{Time: now}
	}
	l.Spec.HolderIdentity = ptr.To(m.o.Identity)
	l.Spec.LeaseDurationSeconds = nil
	if dur > 0 {
		l.Spec.LeaseDurationSeconds = ptr.To(dur)
	}
	l.Spec.RenewTime = &metav1.MicroTime{Time: now}
}

// giveUp stops publishing for shard n and waits for its work in flight.
func (m *Manager) giveUp(n int, kind string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.owned[n] {
		return
	}
	m.owned[n] = false
	for m.inflight[n] > 0 {
		m.idle.Wait()
	}
	handovers.WithLabelValues(kind).Inc()
	m.o.Log.Info("gave up shard", "shard", n, "why", kind)
}

// renewMember renews this replica's member Lease when it is due (every
// LeaseDuration - RenewDeadline), creating it the first time.
func (m *Manager) renewMember(ctx context.Context, now time.Time) error {
	if !m.renewed.IsZero() && now.Sub(m.renewed) < m.o.LeaseDuration-m.o.RenewDeadline {
		return nil
	}
	dur := max(int32(m.o.LeaseDuration/time.Second), 1)
	if m.member != nil {
		l := m.member.DeepCopy()
		m.fill(l, now, dur)
		err := m.o.Client.Update(ctx, l)
		if err == nil {
			m.member, m.renewed = l, now
			return nil
		}
		m.member = nil
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return fmt.Errorf("renew member Lease: %w", err)
		}
		// Written or removed by someone else: read it again.
	}
	name := m.memberLease()
	var l coordinationv1.Lease
	err := m.o.Client.Get(ctx, client.ObjectKey{Namespace: m.o.Namespace, Name: name}, &l)
	if apierrors.IsNotFound(err) {
		l = coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: m.o.Namespace, Name: name,
			Labels: map[string]string{LabelBridge: m.o.Name, LabelRole: RoleMember}}}
		m.fill(&l, now, dur)
		err = m.o.Client.Create(ctx, &l)
	} else if err == nil {
		m.fill(&l, now, dur)
		err = m.o.Client.Update(ctx, &l)
	}
	if err != nil {
		return fmt.Errorf("renew member Lease: %w", err)
	}
	m.member, m.renewed = &l, now
	return nil
}

// releaseAll gives up every shard and frees its Lease, and removes the
// member Lease, on a graceful shutdown.
func (m *Manager) releaseAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// No new work for any shard from now on, and the shards without work
	// in flight first: the others take them while that work ends.
	m.mu.Lock()
	held := m.heldLocked()
	m.stopping = true
	slices.SortFunc(held, func(a, b int) int { return cmp.Or(cmp.Compare(m.inflight[a], m.inflight[b]), cmp.Compare(a, b)) })
	m.mu.Unlock()
	var errs []error
	for _, n := range held {
		m.giveUp(n, "released")
		var fresh coordinationv1.Lease
		if err := m.o.Client.Get(ctx, client.ObjectKey{Namespace: m.o.Namespace, Name: m.shardLease(n)}, &fresh); err == nil && holder(&fresh) == m.o.Identity {
			fresh.Spec.HolderIdentity = ptr.To("")
			errs = append(errs, m.o.Client.Update(ctx, &fresh))
		}
	}
	member := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: m.o.Namespace, Name: m.memberLease()}}
	errs = append(errs, client.IgnoreNotFound(m.o.Client.Delete(ctx, member)))
	if err := errors.Join(errs...); err != nil {
		m.o.Log.Info("releasing the Leases failed; the shards are free once the member Lease expires", "reason", err.Error())
	}
	m.notify()
}

func holder(l *coordinationv1.Lease) string { return ptr.Deref(l.Spec.HolderIdentity, "") }

// shardOf is the shard a shard Lease is for (false for other Leases).
func shardOf(l *coordinationv1.Lease) (int, bool) {
	if l.Labels[LabelRole] != RoleShard {
		return 0, false
	}
	n, err := strconv.Atoi(l.Annotations[annotationShard])
	return n, err == nil && n >= 0
}

// liveMembers is the set of replicas whose member Lease in leases is live
// at now.
func liveMembers(leases []coordinationv1.Lease, now time.Time) map[string]bool {
	out := map[string]bool{}
	for i := range leases {
		if l := &leases[i]; l.Labels[LabelRole] == RoleMember && !expired(l, now) {
			out[holder(l)] = true
		}
	}
	return out
}

// Holders maps the name of every Lease in leases to who holds it at now,
// "" if nobody: a shard Lease is held by its holder while that holder's
// member Lease (which must be in leases too) is live; a member Lease, or
// any other Lease (the leader election's), by its holder until it was not
// renewed for its duration.
func Holders(leases []coordinationv1.Lease, now time.Time) map[string]string {
	members := liveMembers(leases, now)
	out := map[string]string{}
	for i := range leases {
		l := &leases[i]
		h := holder(l)
		if _, ok := shardOf(l); ok && !members[h] || !ok && expired(l, now) {
			h = ""
		}
		out[l.Name] = h
	}
	return out
}

// ShardHolders maps every shard that is held at now to its holder, from
// the Leases of one bridge (its shard and member Leases).
func ShardHolders(leases []coordinationv1.Lease, now time.Time) map[int]string {
	holders := Holders(leases, now)
	out := map[int]string{}
	for i := range leases {
		if n, ok := shardOf(&leases[i]); ok && holders[leases[i].Name] != "" {
			out[n] = holders[leases[i].Name]
		}
	}
	return out
}

func expired(l *coordinationv1.Lease, now time.Time) bool {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return true
	}
	return now.After(l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second))
}
