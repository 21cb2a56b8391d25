package e2e

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/student-bridge/student-bridge/internal/shards"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// shardOwners maps each held shard to its holder, from the shard and
// member Leases (kubectl get leases shows the same).
func shardOwners(w *world) (map[int]string, error) {
	var list coordinationv1.LeaseList
	if err := w.st.Client.List(context.Background(), &list, client.InNamespace("default"),
		client.HasLabels{shards.LabelBridge}); err != nil {
		return nil, err
	}
	return shards.ShardHolders(list.Items, time.Now()), nil
}

// shardHolders counts the shards each replica holds.
func shardHolders(w *world) (map[string]int, error) {
	owners, err := shardOwners(w)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, h := range owners {
		out[h]++
	}
	return out, nil
}

// waitShares waits until replicas hold all 16 shards between lo and hi
// each, and returns how long that took.
func waitShares(t *testing.T, w *world, replicas, lo, hi int) time.Duration {
	t.Helper()
	t0 := time.Now()
	if err := stacktest.Eventually(60*time.Second, func() error {
		h, err := shardHolders(w)
		if err != nil {
			return err
		}
		var counts []int
		total := 0
		for _, n := range h {
			counts = append(counts, n)
			total += n
		}
		sort.Ints(counts)
		if len(h) != replicas || total != 16 || counts[0] < lo || counts[len(counts)-1] > hi {
			return fmt.Errorf("shards held %v (want %d replicas with %d-%d of 16)", h, replicas, lo, hi)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return time.Since(t0)
}

// startReplicas starts three bridges over 16 shards (lease 4s, retry 1s)
// and waits until they share them; it returns their arguments, for
// restarts.
func startReplicas(t *testing.T, w *world) ([]string, []*proc) {
	t.Helper()
	args := w.bridgeArgs(w.admin, "--shards=16", "--leader-election-namespace=default",
		"--leader-election-lease-duration=4s", "--leader-election-renew-deadline=3s", "--leader-election-retry-period=1s")
	var ps []*proc
	for range 3 {
		ps = append(ps, start(t, t.TempDir(), args...))
	}
	waitShares(t, w, 3, 5, 6)
	return args, ps
}

// TestShardsActiveActive: three replicas share 16 shards, 5-6 each, and
// publish a burst completely; one SIGKILLed mid-burst, the other two take
// its shards once their Leases expired, and the stream still holds every
// final state and every delete.
func TestShardsActiveActive(t *testing.T) {
	w := newWorld(t)
	_, ps := startReplicas(t, w)
	// A core subscriber sees every publish, also the copies the stream's
	// duplicate window drops: with settled shards, none is published twice.
	sub, err := stacktest.Subscribe(w.nc, "student.>")
	if err != nil {
		t.Fatal(err)
	}
	burst(t, w, "default", "pre", 30, nil)
	w.waitVerified(t, "default", 60*time.Second)
	got, err := sub.Events()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int{}
	for _, e := range got {
		ids[e.Event.ID()]++
	}
	for id, n := range ids {
		if n > 1 {
			t.Errorf("event %s published %d times by settled replicas", id, n)
		}
	}

	before, err := shardOwners(w)
	if err != nil {
		t.Fatal(err)
	}
	var killed time.Time
	createdAt := map[string]time.Time{}
	burst(t, w, "default", "kill", 30, func(i int) {
		createdAt[fmt.Sprintf("kill-%d", i)] = time.Now()
		if i == 10 {
			if err := ps[0].stop(t, syscall.SIGKILL); err == nil {
				t.Fatal("SIGKILL reported a clean exit")
			}
			killed = time.Now()
		}
	})
	r := w.waitVerified(t, "default", 90*time.Second)
	r.Recovery = time.Since(killed)
	waitShares(t, w, 2, 8, 8)
	t.Logf("fault report: one of three replicas SIGKILLed mid-burst (lease 4s, retry 1s): every final state published %s after the kill; %s", r.Recovery.Round(100*time.Millisecond), r)

	// How long the Students created after the kill waited for their
	// created event: those of the killed replica's shards, and the others.
	after, err := shardHolders(w)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := stacktest.StreamEvents(context.Background(), w.nc, "STUDENTS")
	if err != nil {
		t.Fatal(err)
	}
	var lost, others []time.Duration
	for _, e := range evs {
		at, ok := createdAt[e.Data.Metadata.Name]
		if !ok || e.Event.Type() != "io.k8s.example.student.created" || at.Before(killed) {
			continue
		}
		d := e.Event.Time().Sub(at)
		if _, alive := after[before[shards.Of("default", e.Data.Metadata.Name, 16)]]; alive {
			others = append(others, d)
		} else {
			lost = append(lost, d)
		}
	}
	t.Logf("fault report: Students created after the kill, created event after: killed replica's shards %s, other shards %s",
		spreadOf(lost), spreadOf(others))

	// A graceful stop releases its shards at once.
	if err := ps[1].stop(t, syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	stopped := time.Now()
	took := waitShares(t, w, 1, 16, 16)
	burst(t, w, "default", "after", 9, nil)
	w.waitVerified(t, "default", 60*time.Second)
	t.Logf("fault report: a replica stopped with SIGTERM: the last one held all 16 shards %s later", (time.Since(stopped) - 0*took).Round(100*time.Millisecond))
}

// TestShardsStaleOwner: a replica frozen (SIGSTOP) in the middle of a
// burst, with changes in flight, past its Leases, comes back (SIGCONT) not
// knowing it lost its shards while the others took them over and
// published: what it had reserved and not published goes out as it was (a
// copy the stream drops), what it had not reserved is refused at the
// record store, it gives its shards up on its next renewal or on its first
// conflict, and verify finds nothing (no number used twice, no fork); then
// replicas are restarted one at a time (SIGTERM), and every final state is
// still published. TestShardsPausedOnCluster does the freeze on the
// three-node cluster.
func TestShardsStaleOwner(t *testing.T) {
	w := newWorld(t)
	args, ps := startReplicas(t, w)
	freezeMidBurst(t, w, ps[0])

	// Rolling restart: each replica in turn stopped gracefully and started
	// again while Students change.
	for i := range ps {
		if err := ps[i].stop(t, syscall.SIGTERM); err != nil {
			t.Fatalf("SIGTERM replica %d: %v", i, err)
		}
		burst(t, w, "default", fmt.Sprintf("roll%d", i), 9, nil)
		ps[i] = start(t, t.TempDir(), args...)
		waitShares(t, w, 3, 5, 6)
	}
	r := w.waitVerified(t, "default", 60*time.Second)
	t.Logf("fault report: rolling restart of three replicas: %s", r)
}

// TestShardsPausedOnCluster: TestShardsStaleOwner's freeze, on a
// three-node JetStream cluster with the stream and the record bucket at
// three replicas.
func TestShardsPausedOnCluster(t *testing.T) {
	w := newWorldWith(t, stack.Options{NATSCluster: 3})
	_, ps := startReplicas(t, w)
	freezeMidBurst(t, w, ps[0])
}

// freezeMidBurst freezes p (SIGSTOP) a third of the way into a burst of
// changes, lets the other two replicas take its shards and publish a
// second burst, resumes it (SIGCONT), and makes a third: after each the
// stream, the record store and the API server agree, without exception,
// and at the end the three share the shards again.
func freezeMidBurst(t *testing.T, w *world, p *proc) {
	t.Helper()
	var frozen time.Time
	burst(t, w, "default", "frozen", 30, func(i int) {
		if i != 10 {
			return
		}
		if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		frozen = time.Now()
	})
	waitShares(t, w, 2, 8, 8)
	takeover := time.Since(frozen)
	burst(t, w, "default", "meanwhile", 30, nil)
	w.waitVerified(t, "default", 60*time.Second)
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	burst(t, w, "default", "back", 30, nil)
	r := w.waitVerified(t, "default", 60*time.Second)
	waitShares(t, w, 3, 5, 6)
	t.Logf("fault report: a replica frozen mid-burst past its Leases (lease 4s): its shards taken over %s after the freeze; back, it shares again; %s", takeover.Round(100*time.Millisecond), r)
}

// spreadOf is "n=…, median …, max …" of ds.
func spreadOf(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return fmt.Sprintf("n=%d median %s max %s", len(ds), ds[len(ds)/2].Round(10*time.Millisecond), ds[len(ds)-1].Round(10*time.Millisecond))
}

// TestShardsHandoverOnCluster: three replicas over 16 shards on a
// three-node JetStream cluster, the stream and the record store at three
// replicas. One replica is SIGKILLed and, while the other two wait out its
// Leases to take its shards, the node that leads the record bucket is
// killed too (its routes cut first, as in a crash): the gaining replicas
// reload the shards' records from a bucket electing a new leader. Every
// final state and every delete is published, and the two replicas end up
// holding eight shards each. An update the killed replica reserved and
// published while the bucket had no leader is published again, as it was,
// by its new owner before anything else of that Student: no number is
// used twice, and any finding of verify fails.
func TestShardsHandoverOnCluster(t *testing.T) {
	w := newWorldWith(t, stack.Options{NATSCluster: 3})
	_, ps := startReplicas(t, w)
	burst(t, w, "default", "pre", 30, nil)
	w.waitVerified(t, "default", 60*time.Second)

	js, err := jetstream.New(w.nc)
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := js.Stream(context.Background(), "KV_STUDENT_BRIDGE_PUBLISHED")
	if err != nil {
		t.Fatal(err)
	}
	leader := bucket.CachedInfo().Cluster.Leader
	var killed time.Time
	var restart func() error
	burst(t, w, "default", "handover", 30, func(i int) {
		if i != 10 {
			return
		}
		if err := ps[0].stop(t, syscall.SIGKILL); err == nil {
			t.Fatal("SIGKILL reported a clean exit")
		}
		killed = time.Now()
		if restart, err = w.st.Cluster.Kill(leader); err != nil {
			t.Fatal(err)
		}
	})
	waitShares(t, w, 2, 8, 8)
	took := time.Since(killed)
	if err := restart(); err != nil {
		t.Fatal(err)
	}
	r := w.waitVerified(t, "default", 90*time.Second)
	t.Logf("fault report: one of three replicas SIGKILLed mid-burst and the record bucket's leader %s killed with it (lease 4s): its shards held by the other two %s after the kills; every final state published %s after them; %s",
		leader, took.Round(100*time.Millisecond), time.Since(killed).Round(100*time.Millisecond), r)
}

// TestShardsReplicaCutOffFromAPIServer: three replicas over 16 shards; one
// is cut off from the kube-apiserver (its connections closed and refused,
// while its NATS connection stays up) for longer than its Leases, with
// Students changing meanwhile, on an API server without a watch cache
// that compacts etcd every second: the revision the replica saw last is
// compacted away when it returns, so its cache must list again. The
// cut-off replica gives its shards up and the other two take them. Every
// final state and delete is published, none twice, and nothing is
// published again when it takes its share back.
func TestShardsReplicaCutOffFromAPIServer(t *testing.T) {
	w := newWorldWith(t, stack.Options{APIServerFlags: map[string]string{"watch-cache": "false", "etcd-compaction-interval": "1s"}})
	api, err := url.Parse(w.st.RestConfig.Host)
	if err != nil {
		t.Fatal(err)
	}
	link, err := stack.NewLink(api.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(link.Close)
	admin, err := os.ReadFile(w.admin)
	if err != nil {
		t.Fatal(err)
	}
	cutKubeconfig, viaLink := filepath.Join(t.TempDir(), "cut.kubeconfig"), strings.ReplaceAll(string(admin), "https://"+api.Host, "https://"+link.Addr())
	if !strings.Contains(viaLink, link.Addr()) {
		t.Fatalf("no API server address %s in the kubeconfig", api.Host)
	}
	if err := os.WriteFile(cutKubeconfig, []byte(viaLink), 0o600); err != nil {
		t.Fatal(err)
	}
	shardArgs := []string{"--shards=16", "--leader-election-namespace=default",
		"--leader-election-lease-duration=4s", "--leader-election-renew-deadline=3s", "--leader-election-retry-period=1s"}
	cutMetrics := fmt.Sprintf("127.0.0.1:%d", stacktest.FreePorts(t, 1))
	start(t, t.TempDir(), w.bridgeArgs(cutKubeconfig, append(shardArgs, "--metrics-bind-address", cutMetrics)...)...)
	for range 2 {
		start(t, t.TempDir(), w.bridgeArgs(w.admin, shardArgs...)...)
	}
	waitShares(t, w, 3, 5, 6)
	sub, err := stacktest.Subscribe(w.nc, "student.>")
	if err != nil {
		t.Fatal(err)
	}
	burst(t, w, "default", "pre", 30, nil)
	w.waitVerified(t, "default", 60*time.Second)

	link.Cut()
	cutAt := time.Now()
	burst(t, w, "default", "cut", 30, nil)
	waitShares(t, w, 2, 8, 8)
	takeover := time.Since(cutAt)
	r := w.waitVerified(t, "default", 60*time.Second)
	before, err := sub.Events()
	if err != nil {
		t.Fatal(err)
	}
	acquired := scrape(t, cutMetrics)[`student_bridge_shard_handovers_total{kind="acquired"}`]
	link.Heal()
	waitShares(t, w, 3, 5, 6)
	// Its share back, the replica has loaded its shards' records and
	// queued what its relisted cache says needs a reconcile. Once its own
	// account of those shards has nothing unpublished, and its queue and
	// workers are idle, anything it would publish has been published.
	stacktest.WaitFor(t, "the healed replica idle with nothing unpublished", func() error {
		m := scrape(t, cutMetrics)
		if got := m[`student_bridge_shard_handovers_total{kind="acquired"}`] - acquired; got < 5 {
			return fmt.Errorf("it acquired %v shards since the cut healed, want at least 5", got)
		}
		busy := map[string]float64{}
		for series, v := range m {
			for _, name := range []string{"student_bridge_shard_unpublished", "workqueue_depth", "controller_runtime_active_workers", "student_bridge_catch_up_students"} {
				if strings.HasPrefix(series, name+"{") || series == name {
					busy[name] += v
				}
			}
		}
		for name, v := range busy {
			if v != 0 {
				return fmt.Errorf("%s = %v", name, v)
			}
		}
		if len(busy) < 3 {
			return fmt.Errorf("the metrics name %d of unpublished, queue depth, active workers and catch-up: %v", len(busy), busy)
		}
		return nil
	})
	if err := w.nc.Flush(); err != nil { // what the server sent the subscriber before now is in
		t.Fatal(err)
	}
	got, err := sub.Events()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(before) {
		t.Errorf("%d events published after the cut healed, with no Student changing:", len(got)-len(before))
		for _, e := range got[len(before):] {
			t.Logf("  %s %s %s generation %d resourceVersion %s id %s", e.Event.Type(), e.Data.Metadata.Name, e.Data.Metadata.UID,
				e.Data.Metadata.Generation, e.Data.Metadata.ResourceVersion, e.Event.ID())
		}
	}
	ids := map[string]int{}
	for _, e := range got {
		ids[e.Event.ID()]++
	}
	published := len(got)
	for id, n := range ids {
		if n > 1 {
			t.Errorf("event %s published %d times", id, n)
		}
	}
	burst(t, w, "default", "back", 9, nil)
	r2 := w.waitVerified(t, "default", 60*time.Second)
	t.Logf("fault report: a replica cut off from the kube-apiserver (lease 4s) while 30 Students changed: its shards held by the others %s after the cut; %s; back: %d publishes in all, none twice; then %s",
		takeover.Round(100*time.Millisecond), r, published, r2)
}
