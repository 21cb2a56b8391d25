package bridge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/bridgetest"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/shards"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// writer records, for one replica, its identity (from its member Lease's
// renewals) and the Students whose status it wrote.
type writer struct {
	mu       sync.Mutex
	identity string
	statuses []string
}

func (w *writer) restConfig(leaseID string) *rest.Config {
	cfg := rest.CopyConfig(st.RestConfig)
	member := "/leases/" + leaseID + "-member-"
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			w.mu.Lock()
			switch p := req.URL.Path; {
			case req.Method == http.MethodPut && strings.Contains(p, member):
				w.identity = p[strings.Index(p, member)+len(member):]
			case req.Method != http.MethodGet && strings.HasSuffix(p, "/status") && strings.Contains(p, "/students/"):
				name := strings.TrimSuffix(p, "/status")
				w.statuses = append(w.statuses, name[strings.LastIndex(name, "/")+1:])
			}
			w.mu.Unlock()
			return rt.RoundTrip(req)
		})
	}
	return cfg
}

// shardedConfig is testConfig with four shards, their Leases in ns, and
// Lease timing short enough for handovers within a test (lease 3 s, renew
// deadline 2 s, retry 500 ms).
func shardedConfig(t *testing.T, ns, prefix string) *config.Config {
	t.Helper()
	cfg := testConfig(t, ns, prefix)
	cfg.Shards.Count = 4
	cfg.LeaderElection.Namespace = ns
	cfg.LeaderElection.LeaseDuration, cfg.LeaderElection.RenewDeadline, cfg.LeaderElection.RetryPeriod = 3*time.Second, 2*time.Second, 500*time.Millisecond
	return cfg
}

// shardHolders is who holds each shard of the bridge whose Leases are in
// ns, now.
func shardHolders(t *testing.T, ns string) map[int]string {
	t.Helper()
	var list coordinationv1.LeaseList
	if err := st.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return shards.ShardHolders(list.Items, time.Now())
}

// waitTwoShardsEach waits until two replicas hold two of the four shards
// of the bridge whose Leases are in ns each, and returns who holds which.
func waitTwoShardsEach(t *testing.T, ns string) map[int]string {
	t.Helper()
	var holders map[int]string
	stacktest.WaitFor(t, "two replicas holding two shards each", func() error {
		holders = shardHolders(t, ns)
		count := map[string]int{}
		for _, h := range holders {
			count[h]++
		}
		if len(holders) != 4 || len(count) != 2 {
			return fmt.Errorf("shards held %v", holders)
		}
		for _, c := range count {
			if c != 2 {
				return fmt.Errorf("shards held %v", holders)
			}
		}
		return nil
	})
	return holders
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestStatusOnlyByTheHolder: with two replicas over four shards, a
// Student's status is written only by the replica that holds its shard,
// also when a service's receipts ask every replica for a status write.
func TestStatusOnlyByTheHolder(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := shardedConfig(t, ns, "holder")
	cfg.Services.Expected = []string{"billing"}
	ws := []*writer{{}, {}}
	for _, w := range ws {
		c := *cfg
		bridgetest.Run(t, &c, w.restConfig(cfg.LeaderElection.ID))
	}
	holders := waitTwoShardsEach(t, ns)
	count := map[string]int{}
	for _, h := range holders {
		count[h]++
	}
	stacktest.WaitFor(t, "both replicas' identities seen", func() error {
		var ids []string
		for _, w := range ws {
			w.mu.Lock()
			ids = append(ids, w.identity)
			w.mu.Unlock()
		}
		if ids[0] == "" || ids[0] == ids[1] || count[ids[0]] != 2 || count[ids[1]] != 2 {
			return fmt.Errorf("shards held %v, replicas %v", holders, ids)
		}
		return nil
	})

	const n = 8
	createStudents(t, ns, "s%d", n)
	published := map[string]*studentv1.Student{}
	stacktest.WaitFor(t, "every Student published", func() error {
		for i := range n {
			s := getStudent(t, ns, fmt.Sprintf("s%d", i))
			if c := publishedCondition(s); c == nil || c.Status != metav1.ConditionTrue || s.Status.LastPublished == nil {
				return fmt.Errorf("%s: Published %v", s.Name, c)
			}
			published[s.Name] = s
		}
		return nil
	})
	// billing applied every Student: every replica's receipt watch sees it.
	js, err := jetstream.New(natsConn(t))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, cfg.Receipts.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	applied := receiptCount(t, "applied")
	for _, s := range published {
		b, _ := json.Marshal(studentv1.Receipt{Service: "billing", UID: string(s.UID), Namespace: ns, Name: s.Name,
			EventID: s.Status.LastPublished.ID, Generation: s.Generation, Result: studentv1.ResultApplied, Time: metav1.Now()})
		if _, err := kv.Put(ctx, studentv1.ReceiptKey("billing", string(s.UID)), b); err != nil {
			t.Fatal(err)
		}
	}
	stacktest.WaitFor(t, "every Student in sync", func() error {
		for name := range published {
			if s := getStudent(t, ns, name); s.Status.ServicesInSync != "1/1" {
				return fmt.Errorf("%s: in sync %q", name, s.Status.ServicesInSync)
			}
		}
		return nil
	})
	// Both replicas have read every receipt, and each asked its status
	// writer for the Student's status then: the replica that does not hold
	// the shard must write none. Its writes would come at its share of
	// status.qps, all n within the window.
	stacktest.WaitFor(t, "every receipt read by both replicas", func() error {
		if got := receiptCount(t, "applied") - applied; got < 2*n {
			return fmt.Errorf("%v receipts read, want %d", got, 2*n)
		}
		return nil
	})
	time.Sleep(time.Duration(float64(n) / (cfg.Status.QPS / 2) * float64(time.Second))) // the window above

	if now := shardHolders(t, ns); fmt.Sprint(now) != fmt.Sprint(holders) {
		t.Fatalf("shards moved during the test: %v, then %v", holders, now)
	}
	for _, w := range ws {
		w.mu.Lock()
		for _, name := range w.statuses {
			if h := holders[shards.Of(ns, name, cfg.Shards.Count)]; h != w.identity {
				t.Errorf("replica %s wrote the status of %s, whose shard %s holds", w.identity, name, h)
			}
		}
		w.mu.Unlock()
	}
	for name := range published {
		if c := publishedCondition(getStudent(t, ns, name)); c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("%s in the end: Published %v", name, c)
		}
	}
}

// twoReplicasPublished starts two replicas over four shards with their
// Leases in ns, waits until they hold two shards each, creates Students s0
// to s<n-1> and waits until their events are in the stream. It returns
// the replicas' config, what stops the second, and who held which shard.
func twoReplicasPublished(t *testing.T, ns, prefix string, n int) (cfg *config.Config, stopB func(), holders map[int]string) {
	t.Helper()
	cfg = shardedConfig(t, ns, prefix)
	a, b := *cfg, *cfg
	startBridge(t, &a)
	stopB = startBridge(t, &b)
	holders = waitTwoShardsEach(t, ns)
	for i := range n {
		if err := st.Client.Create(context.Background(), newStudent(ns, fmt.Sprintf("s%d", i), "wang", "china")); err != nil {
			t.Fatal(err)
		}
	}
	waitStream(t, natsConn(t), cfg.NATS.Stream.Name, n)
	return cfg, stopB, holders
}

// TestGainedShardReloadsRecords: a replica that gains a shard reads that
// shard's records from the record store first, so it publishes the next
// change of a Student another replica published as an update, without a
// record-write conflict (which would make it drop the shard again).
func TestGainedShardReloadsRecords(t *testing.T) {
	ns := newNamespace(t)
	const n = 12
	cfg, stopB, _ := twoReplicasPublished(t, ns, "reload", n)
	nc := natsConn(t)

	lost, err := stacktest.Counter("student_bridge_shard_handovers_total", "kind", "lost")
	if err != nil {
		t.Fatal(err)
	}
	stopB() // its shards go to the first replica
	for i := range n {
		patch(t, getStudent(t, ns, fmt.Sprintf("s%d", i)), func(s *studentv1.Student) { s.Spec.School = "peking" })
	}
	evs := waitStream(t, nc, cfg.NATS.Stream.Name, 2*n)
	got := map[string][]string{}
	for _, ev := range evs {
		got[ev.Data.Metadata.Name] = append(got[ev.Data.Metadata.Name], studentv1.Operation(ev.Event.Type()))
	}
	for i := range n {
		name := fmt.Sprintf("s%d", i)
		if fmt.Sprint(got[name]) != "[created updated]" {
			t.Errorf("%s published as %v, want [created updated]", name, got[name])
		}
	}
	if now, err := stacktest.Counter("student_bridge_shard_handovers_total", "kind", "lost"); err != nil || now != lost {
		t.Errorf("shards lost to record-write conflicts after the handover: %v (%v), want none", now-lost, err)
	}
}

// TestGainedShardReconcilesOnlyWhatChanged: a replica that gains the
// shards of one that stopped reconciles the Students of those shards that
// changed, not every one of them.
func TestGainedShardReconcilesOnlyWhatChanged(t *testing.T) {
	ns := newNamespace(t)
	const n = 20
	cfg, stopB, before := twoReplicasPublished(t, ns, "gainonly", n)
	nc := natsConn(t)

	reconciled := reconciles(t)
	stopB() // its shards go to the first replica
	var gained []string
	stacktest.WaitFor(t, "one replica holding every shard", func() error {
		after := shardHolders(t, ns)
		if len(after) != 4 || after[0] != after[1] || after[1] != after[2] || after[2] != after[3] {
			return fmt.Errorf("shards held %v", after)
		}
		gained = nil
		for i := range n {
			name := fmt.Sprintf("s%d", i)
			if shard := shards.Of(ns, name, 4); before[shard] != after[shard] {
				gained = append(gained, name)
			}
		}
		return nil
	})
	if len(gained) < 4 {
		t.Fatalf("the gained shards hold %d of the %d Students: too few to tell", len(gained), n)
	}
	// One of them changes; its event shows the shards were taken over.
	patch(t, getStudent(t, ns, gained[0]), func(s *studentv1.Student) { s.Spec.School = "peking" })
	waitStream(t, nc, cfg.NATS.Stream.Name, n+1)
	if got := reconciles(t) - reconciled; got > 2 {
		t.Errorf("the handover made %.0f reconciles for 1 changed Student of the %d in the gained shards, want 1 (2 at most, should the change come before the gain)", got, len(gained))
	}
}

// TestBudgetsAreTheWholeBridges: kubernetesEventsQPS and status.qps are
// what all replicas together write: two replicas holding two of four
// shards each write at most their share each, so a backlog of Events or
// of status views drains at the budget, not at twice it.
func TestBudgetsAreTheWholeBridges(t *testing.T) {
	t.Run("kubernetesEventsQPS", func(t *testing.T) {
		testBudget(t, "student_bridge_kubernetes_events_total", "written", func(cfg *config.Config) *float64 {
			cfg.Status.Enabled = false
			return &cfg.KubernetesEventsQPS
		})
	})
	t.Run("status.qps", func(t *testing.T) {
		testBudget(t, "student_bridge_status_writes_total", "success", func(cfg *config.Config) *float64 {
			cfg.KubernetesEventsQPS = 1000
			return &cfg.Status.QPS
		})
	})
}

// testBudget sets the budget budget returns to 4 a second, makes 80
// Students, and counts what two replicas write in 3 s: counter's series
// of result.
func testBudget(t *testing.T, counter, result string, budget func(*config.Config) *float64) {
	ns := newNamespace(t)
	cfg := shardedConfig(t, ns, "budget")
	qps := budget(cfg)
	*qps = 4
	a, b := *cfg, *cfg
	startBridge(t, &a)
	startBridge(t, &b)
	waitTwoShardsEach(t, ns)
	const n = 80
	createStudents(t, ns, "s%02d", n)
	waitStream(t, natsConn(t), cfg.NATS.Stream.Name, n) // 80 writes waiting, most not made yet
	written := func() float64 {
		v, err := stacktest.Counter(counter, "result", result)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before, t0 := written(), time.Now()
	time.Sleep(3 * time.Second) // the window the writes are counted in
	got, elapsed := written()-before, time.Since(t0)
	// The budget and a burst of each replica's share.
	if limit := *qps*elapsed.Seconds() + 2*2; got > limit {
		t.Errorf("two replicas wrote %v in %s on a budget of %v a second, want at most %.0f", got, elapsed.Round(time.Millisecond), *qps, limit)
	}
	if got == 0 {
		t.Error("nothing written while 80 waited")
	}
}

// TestOtherShardsChangesAreNotReconciled: with two replicas, a change of a
// Student is reconciled by the replica that holds its shard only; the
// other keeps it in its cache and drops it before its work queue. The
// other replica's count of dropped changes is the evidence that it has
// seen every create: nothing of it can be on its way to a reconcile then.
func TestOtherShardsChangesAreNotReconciled(t *testing.T) {
	ns := newNamespace(t)
	cfg := shardedConfig(t, ns, "notours")
	a, b := *cfg, *cfg
	startBridge(t, &a)
	startBridge(t, &b)
	waitTwoShardsEach(t, ns)
	// ns is new and the bridges watch only it: the gained shards had no
	// Student to queue.
	dropped := func() float64 { return counter(t, "student_bridge_other_shard_changes_total", nil) }
	before, droppedBefore := reconciles(t), dropped()
	const n = 20
	createStudents(t, ns, "s%02d", n)
	waitStream(t, natsConn(t), cfg.NATS.Stream.Name, n)
	stacktest.WaitFor(t, "each create dropped by the replica that does not hold its shard", func() error {
		if d := dropped() - droppedBefore; d < n {
			return fmt.Errorf("%v of %d creates dropped by the other replica", d, n)
		}
		if got := reconciles(t) - before; got < n {
			return fmt.Errorf("%v reconciles of %d created Students", got, n)
		}
		return nil
	})
	// One reconcile per created Student by its holder (a retry may add
	// some); both replicas reconciling each would make 2n.
	if got := reconciles(t) - before; got > n+n/4 {
		t.Errorf("%v reconciles for %d created Students by two replicas, want %d to %d", got, n, n, n+n/4)
	}
}

// reconciles counts the Student controller's reconciles in this test
// binary, whatever their result.
func reconciles(t *testing.T) float64 {
	t.Helper()
	return counter(t, "controller_runtime_reconcile_total", map[string]string{"controller": "student-bridge"})
}
