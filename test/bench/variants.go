package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/consumer"
	"github.com/student-bridge/student-bridge/internal/bridge"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/internal/scheme"
	"github.com/student-bridge/student-bridge/internal/shards"
	"github.com/student-bridge/student-bridge/internal/stack"
)

// A variant is started before the generator runs and stopped after the
// events settled. Every receipt goes to the tracker.
type variant struct {
	name string
	// k8s is false for the NATS ceiling, which needs no API server.
	k8s bool
	// bridge runs student-bridge.
	bridge bool
	// policy gives the variant's namespace the finalizer policy.
	policy bool
	// services runs business services that report receipts.
	services bool
	// syncAlways runs it on a NATS server with sync_interval: always, as
	// the shipped NATS is configured.
	syncAlways bool
	// cluster runs it on a three-node JetStream cluster (syncing always),
	// the stream and buckets at three replicas, as deploy/nats does.
	cluster bool
	start   func(ctx context.Context, e *env, run *run) (stop func(), err error)
}

type env struct {
	st *stack.Stack
	// url, nc and js are the NATS of the variant: the stack's server, the
	// one that syncs every write to disk before its ack (synced), or the
	// cluster; replicas is what its streams and buckets get.
	url      string
	nc       *nats.Conn
	js       jetstream.JetStream
	replicas int
	synced   *env
	cluster  *env
	bins     *binaries
}

// forVariant is the environment v runs in.
func (e *env) forVariant(v variant) *env {
	switch {
	case v.syncAlways:
		return e.synced
	case v.cluster:
		return e.cluster
	}
	return e
}

// run is one (variant, rate, repetition).
type run struct {
	id     string
	ns     string
	prefix string
	stream string
	tr     *tracker
	// studentWrites counts the variant's writes to Students (finalizers,
	// status), eventWrites its Kubernetes Events.
	studentWrites atomic.Int64
	eventWrites   atomic.Int64
	// receiptToStatus are the delays from a service applying a change to
	// the Student showing it in sync (variants with services).
	mu              sync.Mutex
	receiptToStatus []time.Duration
	applied         atomic.Int64 // changes the services applied
	// procs are the variant's own processes, if it runs as processes.
	procs []*proc
}

var variants = []variant{
	{name: "nats-ceiling", k8s: false, start: startNATSCeiling},
	{name: "watch-floor", k8s: true, start: startWatchFloor},
	{name: "raw-informer", k8s: true, start: startRawInformer},
	{name: "raw-informer (sync always)", k8s: true, syncAlways: true, start: startRawInformer},
	{name: "raw-informer (process)", k8s: true, start: startRawInformerProcess},
	// What an at-least-once exporter must do at least: wait for each ack.
	{name: "raw-informer (process, acked)", k8s: true, start: startAckedInformerProcess},
	// The same without compression, as the bridge asks by default
	// (kubeAPICompression).
	{name: "raw-informer (process, acked, uncompressed)", k8s: true, start: startUncompressedInformerProcess},
	{name: "student-bridge", k8s: true, bridge: true, policy: true, start: func(ctx context.Context, e *env, r *run) (func(), error) {
		return startBridge(ctx, e, r, true, true, nil)
	}},
	{name: "student-bridge (sync always)", k8s: true, bridge: true, policy: true, syncAlways: true, start: func(ctx context.Context, e *env, r *run) (func(), error) {
		return startBridge(ctx, e, r, true, true, nil)
	}},
	{name: "student-bridge (no k8s Events)", k8s: true, bridge: true, policy: true, start: func(ctx context.Context, e *env, r *run) (func(), error) {
		return startBridge(ctx, e, r, false, true, nil)
	}},
	{name: "student-bridge (no finalizer)", k8s: true, bridge: true, start: func(ctx context.Context, e *env, r *run) (func(), error) {
		return startBridge(ctx, e, r, true, false, nil)
	}},
	{name: "student-bridge (two services)", k8s: true, bridge: true, policy: true, services: true, start: startBridgeWithServices},
	{name: "student-bridge (1 replica, 16 shards)", k8s: true, bridge: true, policy: true, start: func(ctx context.Context, e *env, r *run) (func(), error) { return startReplicas(ctx, e, r, 1) }},
	{name: "student-bridge (2 replicas, 16 shards)", k8s: true, bridge: true, policy: true, start: func(ctx context.Context, e *env, r *run) (func(), error) { return startReplicas(ctx, e, r, 2) }},
	{name: "student-bridge (3 replicas, 16 shards)", k8s: true, bridge: true, policy: true, start: func(ctx context.Context, e *env, r *run) (func(), error) { return startReplicas(ctx, e, r, 3) }},
	{name: "student-bridge (process)", k8s: true, bridge: true, policy: true, start: bridgeProcess()},
	{name: "student-bridge (3 processes, 16 shards)", k8s: true, bridge: true, policy: true, start: func(ctx context.Context, e *env, r *run) (func(), error) { return startProcesses(ctx, e, r, 3) }},
	// What each guarantee costs the bridge process, and the publishing
	// (write-ahead record, event, record) without any of them.
	{name: "student-bridge (process, no finalizer)", k8s: true, bridge: true, start: bridgeProcess("--hold-deletes-with-finalizer=false")},
	{name: "student-bridge (process, no k8s Events)", k8s: true, bridge: true, policy: true, start: bridgeProcess("--kubernetes-events=false")},
	{name: "student-bridge (process, no status)", k8s: true, bridge: true, policy: true, start: bridgeProcess("--status=false")},
	{name: "student-bridge (process, publishing only)", k8s: true, bridge: true, start: bridgeProcess("--hold-deletes-with-finalizer=false", "--kubernetes-events=false", "--status=false")},
	// The bridge asking for compressed responses, as it did before
	// kubeAPICompression (off by default).
	{name: "student-bridge (process, compressed)", k8s: true, bridge: true, policy: true, start: bridgeProcess("--kube-api-compression")},
	// The records in the events' stream, each change one atomic batch of
	// its event and its record (records.store: stream, docs/one-write.md).
	{name: "student-bridge (process, one write)", k8s: true, bridge: true, policy: true, start: bridgeProcess("--records-store=stream")},
	// The least the delivery guarantees need: publishing only, each
	// change one write of its event with its record.
	{name: "student-bridge (process, publishing only, one write)", k8s: true, bridge: true, start: bridgeProcess("--hold-deletes-with-finalizer=false", "--kubernetes-events=false", "--status=false", "--records-store=stream")},
	{name: "raw-informer (process, NATS cluster)", k8s: true, cluster: true, start: startRawInformerProcess},
	{name: "student-bridge (process, NATS cluster)", k8s: true, bridge: true, policy: true, cluster: true, start: bridgeProcess()},
	{name: "student-bridge (process, NATS cluster, one write)", k8s: true, bridge: true, policy: true, cluster: true, start: bridgeProcess("--records-store=stream")},
	{name: "student-bridge (3 processes, 16 shards, NATS cluster)", k8s: true, bridge: true, policy: true, cluster: true, start: func(ctx context.Context, e *env, r *run) (func(), error) { return startProcesses(ctx, e, r, 3) }},
}

// bridgeProcess starts one bridge process with the flags extra.
func bridgeProcess(extra ...string) func(ctx context.Context, e *env, r *run) (func(), error) {
	return func(ctx context.Context, e *env, r *run) (func(), error) {
		return startProcesses(ctx, e, r, 1, extra...)
	}
}

// startReplicas runs n active-active bridges (16 shards) in this process,
// each with its own NATS connection and identity, and one subscriber.
func startReplicas(ctx context.Context, e *env, r *run, n int) (func(), error) {
	stopAll, err := startBridges(ctx, e, r, n, func(cfg *config.Config) {
		cfg.Shards.Count = 16
		cfg.LeaderElection.ID = "bench-" + r.id
		cfg.LeaderElection.Namespace = r.ns
		cfg.LeaderElection.LeaseDuration, cfg.LeaderElection.RetryPeriod = 3*time.Second, 500*time.Millisecond
	})
	if err != nil {
		return nil, err
	}
	// The shares settled (every replica holds 16/n of the shards, or one
	// more) before the load starts: no handover during the run.
	if err := settled(ctx, e, r, n, 16, 30*time.Second); err != nil {
		stopAll()
		return nil, err
	}
	return withSubscriber(ctx, e, r, stopAll)
}

// settled waits, up to within, until a leader holds the lock (one shard)
// or the replicas hold every shard in fair shares; the Leases are in the
// run's namespace.
func settled(ctx context.Context, e *env, r *run, replicas, count int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		var list coordinationv1.LeaseList
		leaseLists.Add(1)
		if err := e.st.Client.List(ctx, &list, client.InNamespace(r.ns)); err == nil {
			ok := false
			if count == 1 {
				for _, h := range shards.Holders(list.Items, time.Now()) {
					ok = ok || h != ""
				}
			} else {
				holders := map[string]int{}
				held := shards.ShardHolders(list.Items, time.Now())
				for _, h := range held {
					holders[h]++
				}
				ok = len(held) == count && len(holders) == replicas
				for _, c := range holders {
					ok = ok && c >= count/replicas && c <= count/replicas+1
				}
			}
			if ok {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d replicas over %d shards did not settle within %s", replicas, count, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// leaseLists counts settled's lists of Leases, which the API server counts
// with the bridges'.
var leaseLists atomic.Int64

// startBridges runs n bridges for the run in this process, each with its
// own connections and identity, configured by tweak; stopAll stops them.
func startBridges(ctx context.Context, e *env, r *run, n int, tweak func(*config.Config)) (stopAll func(), err error) {
	var stops []func()
	stopAll = func() {
		for _, s := range stops {
			s()
		}
	}
	for range n {
		stop, err := runBridge(ctx, e, r, true, true, tweak)
		if err != nil {
			stopAll()
			return nil, err
		}
		stops = append(stops, stop)
	}
	return stopAll, nil
}

// withSubscriber starts the run's subscriber for a variant that stop
// stops; the stop it returns stops both (stop alone if it cannot start).
func withSubscriber(ctx context.Context, e *env, r *run, stop func()) (func(), error) {
	stopSub, err := subscribe(ctx, e, r)
	if err != nil {
		stop()
		return nil, err
	}
	return func() { stopSub(); stop() }, nil
}

// subscribe delivers every event of the run's stream to the tracker.
func subscribe(ctx context.Context, e *env, r *run) (func(), error) {
	cons, err := e.js.OrderedConsumer(ctx, r.stream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return nil, err
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		at := time.Now()
		ev, err := consumer.DecodeMsg(ctx, &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
		if err != nil {
			return
		}
		var d studentv1.StudentEventData
		if json.Unmarshal(ev.Data(), &d) != nil {
			return
		}
		r.tr.receive(receipt{name: d.Metadata.Name, op: studentv1.Operation(ev.Type()), gen: d.Metadata.Generation, id: ev.ID(), at: at})
	})
	if err != nil {
		return nil, err
	}
	return cc.Stop, nil
}

func ensureStream(ctx context.Context, e *env, r *run) error {
	_, err := natssink.EnsureStream(ctx, e.js, natssink.StreamConfig{Name: r.stream, Subject: r.prefix + ".>", Storage: "file", Replicas: e.replicas, Duplicates: 2 * time.Minute}, true)
	return err
}

// startNATSCeiling: the generator's "changes" are async JetStream publishes
// of event-sized messages with Nats-Msg-Id; see publishCeiling.
func startNATSCeiling(ctx context.Context, e *env, r *run) (func(), error) {
	if err := ensureStream(ctx, e, r); err != nil {
		return nil, err
	}
	return subscribe(ctx, e, r)
}

// startWatchFloor: a bare watch that timestamps Student events.
func startWatchFloor(ctx context.Context, e *env, r *run) (func(), error) {
	wc, err := client.NewWithWatch(e.st.RestConfig, client.Options{Scheme: e.st.Client.Scheme()})
	if err != nil {
		return nil, err
	}
	w, err := wc.Watch(ctx, &studentv1.StudentList{}, client.InNamespace(r.ns))
	if err != nil {
		return nil, err
	}
	go func() {
		for ev := range w.ResultChan() {
			s, ok := ev.Object.(*studentv1.Student)
			if !ok {
				continue
			}
			op := map[watch.EventType]string{watch.Added: "created", watch.Modified: "updated", watch.Deleted: "deleted"}[ev.Type]
			r.tr.receive(receipt{name: s.Name, op: op, gen: s.Generation, at: time.Now()})
		}
	}()
	return w.Stop, nil
}

// startRawInformer: the practical limit of this job: an informer whose
// handlers build the CloudEvent and publish it to JetStream, without API
// writes or Kubernetes Events.
func startRawInformer(ctx context.Context, e *env, r *run) (func(), error) {
	if err := ensureStream(ctx, e, r); err != nil {
		return nil, err
	}
	stop, err := runRawInformer(ctx, e.st.RestConfig, e.js, r.ns, r.prefix, false)
	if err != nil {
		return nil, err
	}
	return withSubscriber(ctx, e, r, stop)
}

// rawInformerCache is the raw informer's cache of the Students of ns and
// its informer, not started: the raw informer variant's, and the
// reference a restart is compared with (informer-sync).
func rawInformerCache(ctx context.Context, restCfg *rest.Config, ns string) (cache.Cache, cache.Informer, error) {
	c, err := cache.New(restCfg, cache.Options{Scheme: scheme.New(), DefaultNamespaces: map[string]cache.Config{ns: {}},
		DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return nil, nil, err
	}
	inf, err := c.GetInformer(ctx, &studentv1.Student{})
	return c, inf, err
}

// runRawInformer runs the raw informer on Students of ns, publishing with
// js under prefix, until stop; it returns once its cache synced. Unless
// acked, it does not wait for JetStream's acks: the most an informer can
// publish. Acked, each handler waits for its event's ack, as any
// at-least-once exporter must before it calls a change delivered.
func runRawInformer(ctx context.Context, restCfg *rest.Config, js jetstream.JetStream, ns, prefix string, acked bool) (stop func(), err error) {
	layout, _ := natssink.NewSubjectLayout(prefix, natssink.DefaultSubjectLayout)
	ctx, cancel := context.WithCancel(ctx)
	c, inf, err := rawInformerCache(ctx, restCfg, ns)
	if err != nil {
		cancel()
		return nil, err
	}
	publish := func(typ string, s *studentv1.Student) {
		ev, err := contract.NewEvent("bench", typ, contract.EventID(typ, s, s.ResourceVersion), s, nil, time.Now())
		if err != nil {
			return
		}
		msg, err := natssink.EncodeMsg(ctx, ev, layout.Subject(ev), natssink.Structured)
		if err != nil {
			return
		}
		if acked {
			_, _ = js.PublishMsg(ctx, msg, jetstream.WithMsgID(ev.ID()))
			return
		}
		_, _ = js.PublishMsgAsync(msg, jetstream.WithMsgID(ev.ID()))
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { publish(studentv1.EventTypeCreated, o.(*studentv1.Student)) },
		UpdateFunc: func(old, o any) {
			if old.(*studentv1.Student).Generation != o.(*studentv1.Student).Generation {
				publish(studentv1.EventTypeUpdated, o.(*studentv1.Student))
			}
		},
		DeleteFunc: func(o any) {
			if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if s, ok := o.(*studentv1.Student); ok {
				publish(studentv1.EventTypeDeleted, s)
			}
		},
	})
	if err != nil {
		cancel()
		return nil, err
	}
	go func() { _ = c.Start(ctx) }()
	informerSynced(ctx, inf)
	return cancel, nil
}

// informerSynced waits until inf has synced, without polling (the
// cache's WaitForCacheSync looks every 100 ms), as the bridge waits for
// its own: a restart is compared with a sync seen at once.
func informerSynced(ctx context.Context, inf cache.Informer) bool {
	return toolscache.WaitFor(ctx, "", inf.HasSyncedChecker())
}

// startBridge runs the real bridge in this process, counting its API writes.
func startBridge(ctx context.Context, e *env, r *run, kubeEvents, holdWithFinalizer bool, tweak func(*config.Config)) (func(), error) {
	stop, err := runBridge(ctx, e, r, kubeEvents, holdWithFinalizer, tweak)
	if err != nil {
		return nil, err
	}
	return withSubscriber(ctx, e, r, stop)
}

// runBridge runs one bridge for the run until the returned stop.
func runBridge(ctx context.Context, e *env, r *run, kubeEvents, holdWithFinalizer bool, tweak func(*config.Config)) (func(), error) {
	cfg, err := config.NewLoader(nil, config.BridgeCommand).Load("")
	if err != nil {
		return nil, err
	}
	cfg.Cluster = "bench"
	cfg.Namespaces = []string{r.ns}
	cfg.NATS.URLs = e.url
	cfg.NATS.Stream.Replicas, cfg.Records.Replicas = e.replicas, e.replicas
	cfg.NATS.SubjectPrefix = r.prefix
	cfg.NATS.Stream.Name = r.stream
	cfg.Records.Bucket = r.stream + "_RECORDS"
	cfg.Deletes.HoldWithFinalizer = holdWithFinalizer
	cfg.LeaderElection.Enabled = false
	cfg.MetricsAddr, cfg.HealthAddr = "0", "0"
	cfg.KubernetesEvents = kubeEvents
	cfg.Snapshot.RequestSubject = ""
	if w := os.Getenv("BENCH_WORKERS"); w != "" {
		cfg.Workers, _ = strconv.Atoi(w)
	}
	cfg.Receipts.Bucket = r.stream + "_RECEIPTS"
	if tweak != nil {
		tweak(cfg)
	}
	restCfg := rest.CopyConfig(e.st.RestConfig)
	restCfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			switch {
			case req.Method == http.MethodGet:
			case strings.Contains(req.URL.Path, "/students"):
				r.studentWrites.Add(1)
			case strings.Contains(req.URL.Path, "/events"):
				r.eventWrites.Add(1)
			}
			return rt.RoundTrip(req)
		})
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- bridge.Run(ctx, cfg, restCfg) }()
	// The stream exists once the bridge is ready for its first publish.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := e.js.Stream(ctx, r.stream); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			return nil, fmt.Errorf("bridge did not create stream %s", r.stream)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintf(os.Stderr, "bridge %s stopped: %v\n", r.stream, err)
		}
	}, nil
}

// benchServices are the simulated business services.
var benchServices = []string{"billing", "library"}

// startBridgeWithServices runs the bridge expecting two services, and the
// two services: consumer.Mirrors whose handler applies every change at
// once. It measures how long after a service applied a change the Student
// shows it in sync (from an informer on the run's namespace).
func startBridgeWithServices(ctx context.Context, e *env, r *run) (func(), error) {
	stopBridge, err := startBridge(ctx, e, r, true, true, func(cfg *config.Config) { cfg.Services.Expected = benchServices })
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	stop := func() { cancel(); stopBridge() }
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := e.js.KeyValue(sctx, r.stream+"_RECEIPTS"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("bridge did not create bucket %s_RECEIPTS", r.stream)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var applied sync.Map // service/eventID -> time.Time
	var wg sync.WaitGroup
	for _, svc := range benchServices {
		m, err := consumer.NewMirror(e.nc, consumer.MirrorOptions{Service: svc, Stream: r.stream, Subjects: r.prefix + ".>",
			ReceiptsBucket: r.stream + "_RECEIPTS", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Handler: func(_ context.Context, c consumer.Change) error {
				applied.Store(svc+"/"+c.EventID, time.Now())
				r.applied.Add(1)
				return nil
			}})
		if err != nil {
			stop()
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.Run(sctx); err != nil {
				fmt.Fprintf(os.Stderr, "service %s: %v\n", svc, err)
			}
		}()
	}
	c, err := cache.New(e.st.RestConfig, cache.Options{Scheme: e.st.Client.Scheme(), DefaultNamespaces: map[string]cache.Config{r.ns: {}}})
	if err != nil {
		stop()
		return nil, err
	}
	inf, err := c.GetInformer(sctx, &studentv1.Student{})
	if err != nil {
		stop()
		return nil, err
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{UpdateFunc: func(_, obj any) {
		s, ok := obj.(*studentv1.Student)
		if !ok {
			return
		}
		for _, svc := range s.Status.Services {
			if svc.State != studentv1.ServiceInSync {
				continue
			}
			if at, ok := applied.LoadAndDelete(svc.Name + "/" + svc.AppliedEventID); ok {
				r.mu.Lock()
				r.receiptToStatus = append(r.receiptToStatus, time.Since(at.(time.Time)))
				r.mu.Unlock()
			}
		}
	}}); err != nil {
		stop()
		return nil, err
	}
	go func() { _ = c.Start(sctx) }()
	return func() { stop(); wg.Wait() }, nil
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// publishCeiling is the NATS ceiling's generator: async JetStream publishes
// of messages the size of a bridge event, open loop at rate.
func publishCeiling(ctx context.Context, e *env, r *run, rate int, d time.Duration) bool {
	layout, _ := natssink.NewSubjectLayout(r.prefix, natssink.DefaultSubjectLayout)
	behind := pace(rate, d, func(i int, at time.Time) {
		name := fmt.Sprintf("c-%s-%d", r.id, i)
		s := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: name, UID: "u", Generation: 1, ResourceVersion: "1"},
			Spec: studentv1.StudentSpec{Name: name, School: "s1"}}
		ev, _ := contract.NewEvent("bench", studentv1.EventTypeCreated, contract.EventID(studentv1.EventTypeCreated, s, name), s, nil, at)
		msg, _ := natssink.EncodeMsg(ctx, ev, layout.Subject(ev), natssink.Structured)
		ch := &change{name: name, op: "created", gen: 1, scheduled: at}
		_, ch.err = e.js.PublishMsgAsync(msg, jetstream.WithMsgID(ev.ID()))
		ch.doneAt = time.Now()
		r.tr.add(ch)
	})
	select {
	case <-e.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
	}
	return behind
}

// policyLabels mark the namespaces the finalizer policy applies to.
var policyLabels = map[string]string{"bench.student-bridge.example/finalizer-policy": "true"}

// newNamespace creates a namespace; withPolicy binds the finalizer policy
// to it.
func newNamespace(ctx context.Context, e *env, name string, withPolicy bool) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: strings.ToLower(name)}}
	if withPolicy {
		ns.Labels = policyLabels
	}
	return e.st.Client.Create(ctx, ns)
}

// otherNATS is a NATS of the variants that do not run on the stack's
// server: one with file storage synced to disk before every ack
// (sync_interval: always, as deploy/nats and the NATS chart values set
// it), for the variants that measure what that costs, or a three-node
// cluster as deploy/nats runs.
type otherNATS struct {
	env  *env
	stop func()
	conn *nats.Conn
}

// syncedNATS is a server that syncs always.
func syncedNATS() (*otherNATS, error) {
	srv, err := stack.StartNATS(stack.NATSOptions{Configure: func(o *natsserver.Options) { o.SyncAlways = true }})
	if err != nil {
		return nil, err
	}
	return connectNATS(srv.URL(), 1, srv.Stop)
}

// clusterNATS is a three-node cluster (which syncs always).
func clusterNATS() (*otherNATS, error) {
	c, err := stack.StartNATSCluster(3, stack.NATSClusterOptions{})
	if err != nil {
		return nil, err
	}
	return connectNATS(c.URL(), 3, c.Stop)
}

func connectNATS(url string, replicas int, stop func()) (*otherNATS, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		stop()
		return nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		nc.Close()
		stop()
		return nil, err
	}
	return &otherNATS{env: &env{url: url, nc: nc, js: js, replicas: replicas}, stop: stop, conn: nc}, nil
}

func (s *otherNATS) close() {
	s.conn.Close()
	s.stop()
}
