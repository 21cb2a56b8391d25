// Package bridge wires the configured parts of student-bridge together: the
// NATS connection, the JetStream stream and record store, the
// controller-runtime manager and the Student reconciler. cmd/student-bridge,
// the local dev stack and the process-level tests all start the bridge
// through Run.
package bridge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/kubeevents"
	"github.com/student-bridge/student-bridge/internal/natsconn"
	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/internal/records"
	"github.com/student-bridge/student-bridge/internal/scheme"
	"github.com/student-bridge/student-bridge/internal/shards"
	"github.com/student-bridge/student-bridge/internal/stages"
	"github.com/student-bridge/student-bridge/internal/statusview"
	"github.com/student-bridge/student-bridge/internal/tracing"
	"github.com/student-bridge/student-bridge/internal/version"
	"github.com/student-bridge/student-bridge/reconciler"
)

// moveAfterAckTimeouts is how many ack timeouts of failures in a row on a
// live NATS connection move it to another server.
const moveAfterAckTimeouts = 3

// reconcileSlack is what one reconcile may take beyond a publish's ack
// timeout: the record store's writes and the API server's requests.
const reconcileSlack = 30 * time.Second

// Run runs the bridge until ctx is cancelled, then shuts down gracefully:
// in-flight publishes and their record writes finish (bounded by
// cfg.ShutdownTimeout) before the NATS connection is drained.
func Run(ctx context.Context, cfg *config.Config, restCfg *rest.Config) error {
	log := ctrl.Log.WithName("bridge")
	log.Info("starting", "version", version.Version, "commit", version.Commit, "nats", config.Redacted(cfg.NATS.URLs), "mode", cfg.NATS.Mode, "encoding", cfg.NATS.Encoding,
		"stream", cfg.NATS.Stream.Name, "bucket", cfg.Records.Bucket, "cluster", cfg.Cluster, "namespaces", cfg.Namespaces,
		"leaderElection", cfg.LeaderElection.Enabled, "holdDeletesWithFinalizer", cfg.Deletes.HoldWithFinalizer)

	registerMetrics()
	layout, err := natssink.NewSubjectLayout(cfg.NATS.SubjectPrefix, cfg.NATS.SubjectLayout)
	if err != nil {
		return fmt.Errorf("config key nats.subjectLayout: %w", err)
	}
	stopTracing, err := tracing.Setup(ctx, reconciler.ControllerName)
	if err != nil {
		return err
	}
	defer func() {
		// Flush the spans of the last publishes.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = stopTracing(sctx)
	}()
	nc, err := natsconn.Connect(cfg.NATS, ctrl.Log.WithName("nats"))
	if err != nil {
		return err
	}
	defer func() {
		// Drain flushes what is buffered; the publishes themselves have all
		// returned by now.
		if err := nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			nc.Close()
		}
	}()
	// Publishes and record writes that fail for moveAfterAckTimeouts ack
	// timeouts in a row on a live connection move it to another server:
	// the one it has is cut off from its cluster.
	mover := natssink.NewMover(nc, moveAfterAckTimeouts*cfg.NATS.AckTimeout)
	pub, err := newPublisher(cfg, nc, layout, mover)
	if err != nil {
		return err
	}

	restCfg = rest.CopyConfig(restCfg)
	restCfg.QPS, restCfg.Burst = cfg.KubeAPIQPS, cfg.KubeAPIBurst
	countAPIRequests(restCfg)
	selector, err := labels.Parse(cfg.LabelSelector)
	if err != nil {
		return fmt.Errorf("config key labelSelector: %w", err)
	}
	// The cache shares the records' strings (trimStudent), so both exist
	// before the manager.
	recs := records.New()
	defer recs.Forget()
	mgr, err := newManager(cfg, restCfg, selector, recs)
	if err != nil {
		return err
	}
	brokerReady, err := addBrokerSetup(mgr, cfg, nc, layout, log)
	if err != nil {
		return err
	}
	r, err := addReconciler(mgr, cfg, restCfg, selector, pub, recs, log)
	if err != nil {
		return err
	}
	if err := mgr.Add(&recordLoader{nc: nc, pub: pub, mover: mover, cfg: cfg, selector: selector, mgr: mgr, r: r, log: log.WithName("records")}); err != nil {
		return err
	}
	if cfg.Receipts.Bucket != "" {
		defer r.CountServices()()
		if err := mgr.Add(&receiptWatch{nc: nc, cfg: cfg, mgr: mgr, r: r, log: log.WithName("receipts")}); err != nil {
			return err
		}
	}
	if err := addSnapshots(mgr, cfg, nc, pub, r.Records, log); err != nil {
		return err
	}
	if err := addHealth(mgr, cfg, nc, brokerReady); err != nil {
		return err
	}
	if err := mgr.Add(connectionWatch{nc: nc, maxReconnects: cfg.NATS.MaxReconnects}); err != nil {
		return err
	}

	log.Info("running")
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	log.Info("stopped")
	return nil
}

var registerOnce sync.Once

// registerMetrics registers every metric of the bridge with
// controller-runtime's registry, which the manager serves on
// metrics-bind-address; once per process, however many bridges it runs.
func registerMetrics() {
	registerOnce.Do(func() {
		version.RegisterMetrics()
		natsconn.RegisterMetrics()
		natssink.RegisterMetrics(crmetrics.Registry)
		kubeevents.RegisterMetrics()
		shards.RegisterMetrics()
		reconciler.RegisterMetrics()
		crmetrics.Registry.MustRegister(snapshotRequests, shardBacklog, apiRequests)
		for _, r := range []string{snapshotNewRun, snapshotCoalesced, snapshotRefused} {
			snapshotRequests.WithLabelValues(r)
		}
	})
}

func newPublisher(cfg *config.Config, nc *nats.Conn, layout natssink.SubjectLayout, mover *natssink.Mover) (*natssink.Publisher, error) {
	pcfg := natssink.Config{
		Mode:       natssink.Mode(cfg.NATS.Mode),
		Encoding:   natssink.Encoding(cfg.NATS.Encoding),
		Layout:     layout,
		AckTimeout: cfg.NATS.AckTimeout,
		Mover:      mover,
	}
	if pcfg.Mode == natssink.JetStream {
		// An ack from another stream that happens to capture the subject
		// is not the store consumers replay from.
		pcfg.Stream = cfg.NATS.Stream.Name
	}
	return natssink.NewPublisher(nc, pcfg)
}

// addBrokerSetup adds the stream ensurer (JetStream mode) and returns what
// tells readiness that the broker side is set up.
func addBrokerSetup(mgr manager.Manager, cfg *config.Config, nc *nats.Conn, layout natssink.SubjectLayout, log logr.Logger) (func() bool, error) {
	if cfg.NATS.Mode != string(natssink.JetStream) {
		return func() bool { return true }, nil
	}
	stream := &streamEnsurer{nc: nc, cfg: streamConfig(cfg, layout), create: cfg.NATS.Stream.Create, log: log.WithName("stream")}
	if cfg.Fleet.HubDomain != "" {
		stream.domain = cfg.Cluster
	}
	if err := mgr.Add(stream); err != nil {
		return nil, err
	}
	return stream.ready.Load, nil
}

// addReconciler sets up the Student reconciler with its Kubernetes Event
// recorder, status writer, receipts and shards. Every field of the
// reconciler is set before SetupWithManager: nothing changes it once the
// controller has it.
func addReconciler(mgr manager.Manager, cfg *config.Config, restCfg *rest.Config, selector labels.Selector, pub *natssink.Publisher, recs *records.Set, log logr.Logger) (*reconciler.StudentReconciler, error) {
	r := &reconciler.StudentReconciler{
		Client:            mgr.GetClient(),
		APIReader:         mgr.GetAPIReader(),
		Sink:              pub,
		Records:           recs,
		HoldWithFinalizer: cfg.Deletes.HoldWithFinalizer,
		Recorder:          nopRecorder{},
		Cluster:           cfg.Cluster,
		Timeout:           cfg.NATS.AckTimeout + reconcileSlack,
		InScope:           reconciler.Scope(cfg.Namespaces, selector),
		Namespaces:        cfg.Namespaces,
	}
	// Every worker busy: changes are waiting for the API server, and
	// Events and status writes would only take capacity from them.
	busy := func() bool { return r.InFlight() >= cfg.Workers }
	if cfg.KubernetesEvents {
		rec, err := kubeevents.New(mgr.GetClient(), mgr.GetScheme(), kubeevents.Options{
			Controller: reconciler.ControllerName,
			QPS:        cfg.KubernetesEventsQPS,
			Log:        log.WithName("events"),
			Busy:       busy,
			Waited:     func(d time.Duration) { stages.Observe(stages.KubernetesEvent, d) },
		})
		if err != nil {
			return nil, err
		}
		if err := mgr.Add(rec); err != nil {
			return nil, err
		}
		r.Recorder = rec
	}
	if cfg.Status.Enabled {
		r.Status = statusview.NewWriter(mgr.GetClient(), r.View, cfg.Status.QPS, busy, log.WithName("status"))
		if err := mgr.Add(r.Status); err != nil {
			return nil, err
		}
	}
	if cfg.Receipts.Bucket != "" {
		r.Receipts = statusview.NewReceipts(cfg.Services.Expected, nil)
	}
	if cfg.Shards.Count > 1 {
		if err := addShards(mgr, cfg, restCfg, r, log); err != nil {
			return nil, err
		}
	}
	skip := true
	if err := r.SetupWithManager(mgr, controller.Options{
		MaxConcurrentReconciles: cfg.Workers,
		RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](cfg.Retry.BaseDelay, cfg.Retry.MaxDelay),
		// Tests and the dev stack may run more than one bridge per process.
		SkipNameValidation: &skip,
	}); err != nil {
		return nil, fmt.Errorf("set up controller: %w", err)
	}
	return r, nil
}

func addSnapshots(mgr manager.Manager, cfg *config.Config, nc *nats.Conn, pub *natssink.Publisher, recs *records.Set, log logr.Logger) error {
	if !cfg.Snapshot.OnStartup && cfg.Snapshot.RequestSubject == "" {
		return nil
	}
	var subjects []string
	if s := cfg.Snapshot.RequestSubject; s != "" {
		subjects = append(subjects, s)
		if cfg.Fleet.HubDomain != "" {
			// From the hub, a request names the cluster: the plain subject
			// does not cross the leaf node connection (docs/fleet.md).
			subjects = append(subjects, s+"."+cfg.Cluster)
		}
	}
	stream := "" // core NATS stores nothing: only runs in flight are shared
	if cfg.NATS.Mode == string(natssink.JetStream) {
		stream = cfg.NATS.Stream.Name
	}
	return mgr.Add(&snapshotServer{
		nc:          nc,
		cache:       mgr.GetCache(),
		snap:        &reconciler.Snapshotter{Reader: mgr.GetClient(), Sink: pub, Cluster: cfg.Cluster, Records: recs},
		onStartup:   cfg.Snapshot.OnStartup,
		subjects:    subjects,
		namespaces:  cfg.Namespaces,
		stream:      stream,
		minInterval: cfg.Snapshot.MinInterval,
		log:         log.WithName("snapshot"),
	})
}

func addHealth(mgr manager.Manager, cfg *config.Config, nc *nats.Conn, brokerReady func() bool) error {
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("nats", func(*http.Request) error {
		switch {
		case !nc.IsConnected():
			return fmt.Errorf("NATS %s", nc.Status())
		case !brokerReady():
			return fmt.Errorf("stream %s not ready", cfg.NATS.Stream.Name)
		}
		return nil
	})
}

func newManager(cfg *config.Config, restCfg *rest.Config, selector labels.Selector, recs *records.Set) (manager.Manager, error) {
	students := cache.ByObject{Transform: trimStudent(recs)}
	cacheOpts := cache.Options{DefaultTransform: cache.TransformStripManagedFields()}
	if len(cfg.Namespaces) > 0 {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range cfg.Namespaces {
			cacheOpts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	if cfg.LabelSelector != "" {
		students.Label = selector
	}
	cacheOpts.ByObject = map[client.Object]cache.ByObject{&studentv1.Student{}: students}
	// With shards, every replica publishes (for the shards it holds): no
	// leader for the whole manager.
	leaderElection := cfg.LeaderElection.Enabled && cfg.Shards.Count <= 1
	leNamespace := ""
	if leaderElection {
		leNamespace = leaseNamespace(cfg)
	}
	grace := cfg.ShutdownTimeout
	le := cfg.LeaderElection
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                  scheme.New(),
		MapperProvider:          newMapper,
		Cache:                   cacheOpts,
		Metrics:                 metricsserver.Options{BindAddress: cfg.MetricsAddr},
		HealthProbeBindAddress:  cfg.HealthAddr,
		PprofBindAddress:        cfg.PprofAddr,
		LeaderElection:          leaderElection,
		LeaderElectionID:        cfg.LeaderElection.ID,
		LeaderElectionNamespace: leNamespace,
		// Step down at once on SIGTERM so a standby takes over without
		// waiting for the lease to expire.
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &le.LeaseDuration,
		RenewDeadline:                 &le.RenewDeadline,
		RetryPeriod:                   &le.RetryPeriod,
		GracefulShutdownTimeout:       &grace,
	})
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	return mgr, nil
}

// trimStudent keeps in the cache only what the bridge reads of a Student
// (statusview.TrimForCache), with the strings it shares with its record
// held once (Records.Share).
func trimStudent(recs *records.Set) toolscache.TransformFunc {
	return func(obj any) (any, error) {
		if s, ok := obj.(*studentv1.Student); ok {
			statusview.TrimForCache(s)
			recs.Share(s)
		}
		return obj, nil
	}
}

type nopRecorder struct{}

func (nopRecorder) Eventf(_, _ runtime.Object, _, _, _, _ string, _ ...any) {}

// Leader election needs a Lease in the bridge's own namespace and records its
// transitions as core Events there.
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=student-bridge-system,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=student-bridge-system,resources=events,verbs=create;patch
