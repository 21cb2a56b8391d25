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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
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
	"github.com/student-bridge/student-bridge/internal/studentwatch"
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

	restCfg = kubeAPIConfig(cfg, restCfg)
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
	p, err := addReconciler(mgr, cfg, restCfg, selector, pub, recs, log)
	if err != nil {
		return err
	}
	if err := mgr.Add(&recordLoader{nc: nc, pub: pub, mover: mover, cfg: cfg, selector: selector, mgr: mgr, r: p.r, recs: recs, log: log.WithName("records")}); err != nil {
		return err
	}
	if cfg.Receipts.Bucket != "" {
		defer p.r.CountServices()()
		if err := mgr.Add(&receiptWatch{nc: nc, cfg: cfg, mgr: mgr, parts: p, recs: recs, log: log.WithName("receipts")}); err != nil {
			return err
		}
	}
	if err := addSnapshots(mgr, cfg, nc, pub, recs, log); err != nil {
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

// reconcilerParts are the Student reconciler and the parts it was made
// with that other runnables feed: the receipts watch shows receipts
// through them, the shards manager sets their share of the budgets.
type reconcilerParts struct {
	r        *reconciler.StudentReconciler
	recorder events.EventRecorder
	events   *kubeevents.Recorder // nil: Kubernetes Events are off
	status   *statusview.Writer   // nil: status is off
	receipts *statusview.Receipts // nil: receipts are off
}

// addReconciler sets up the Student reconciler with its Kubernetes Event
// recorder, status writer, receipts and shards, made in that order; the
// reconciler is made last, from all of them, and never changed. The parts
// that call back into it (the workers' busy check, the status view, the
// queueing of a gained shard) close over the variable r: they call it only
// once the manager runs, after r is set.
func addReconciler(mgr manager.Manager, cfg *config.Config, restCfg *rest.Config, selector labels.Selector, pub *natssink.Publisher, recs *records.Set, log logr.Logger) (*reconcilerParts, error) {
	var r *reconciler.StudentReconciler
	// Every worker busy: changes are waiting for the API server, and
	// Events and status writes would only take capacity from them.
	busy := func() bool { return r.InFlight() >= cfg.Workers }
	p := &reconcilerParts{recorder: nopRecorder{}}
	opts := reconciler.Options{
		Cluster:           cfg.Cluster,
		HoldWithFinalizer: cfg.Deletes.HoldWithFinalizer,
		InScope:           reconciler.Scope(cfg.Namespaces, selector),
		LabelScoped:       !selector.Empty(),
		Namespaces:        cfg.Namespaces,
		Timeout:           cfg.NATS.AckTimeout + reconcileSlack,
	}
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
		p.recorder, p.events = rec, rec
	}
	opts.Recorder = p.recorder
	var owns func(types.NamespacedName) bool // nil: every Student is this replica's
	if cfg.Shards.Count > 1 {
		m, err := addShards(mgr, cfg, restCfg, recs, func() *reconciler.StudentReconciler { return r }, p, log)
		if err != nil {
			return nil, err
		}
		opts.Shards, owns = m, m.Owns
	}
	if cfg.Status.Enabled {
		view := func(stu *studentv1.Student) studentv1.StudentStatus { return r.View(stu) }
		p.status = statusview.NewWriter(mgr.GetClient(), view, statusview.WriterOptions{QPS: cfg.Status.QPS, Busy: busy, Owns: owns, Log: log.WithName("status")})
		if err := mgr.Add(p.status); err != nil {
			return nil, err
		}
		opts.Status = p.status
	}
	if cfg.Receipts.Bucket != "" {
		p.receipts = statusview.NewReceipts(cfg.Services.Expected, nil)
		opts.Receipts = p.receipts
	}
	var err error
	r, err = reconciler.New(reconciler.Deps{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Sink: pub, Records: recs}, opts)
	if err != nil {
		return nil, err
	}
	p.r = r
	skip := true
	if err := r.SetupWithManager(mgr, controller.Options{
		MaxConcurrentReconciles: cfg.Workers,
		RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](cfg.Retry.BaseDelay, cfg.Retry.MaxDelay),
		// Tests and the dev stack may run more than one bridge per process.
		SkipNameValidation: &skip,
	}); err != nil {
		return nil, fmt.Errorf("set up controller: %w", err)
	}
	return p, nil
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

// kubeAPIConfig is restCfg as the bridge uses it: its request budget
// (kubeAPIQPS, kubeAPIBurst), its requests counted, and uncompressed
// unless kubeAPICompression asks for gzip: kube-apiserver gzips the
// Students' watch-list stream event by event, and on the network a
// controller shares with its API server that costs CPU on both ends and
// saves no time (Kubernetes' own control plane turns it off too). A
// kubeconfig's disable-compression still turns it off.
func kubeAPIConfig(cfg *config.Config, restCfg *rest.Config) *rest.Config {
	restCfg = rest.CopyConfig(restCfg)
	restCfg.QPS, restCfg.Burst = cfg.KubeAPIQPS, cfg.KubeAPIBurst
	restCfg.DisableCompression = restCfg.DisableCompression || !cfg.KubeAPICompression
	countAPIRequests(restCfg)
	return restCfg
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
		NewCache:                newCache(cfg, students.Label),
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

// newCache is the manager's cache: controller-runtime's, whose Students'
// informer decodes the watch with watchjson's decoders (less than half
// the CPU per watch event, docs/performance.md) when it watches one
// namespace or all. Over several
// namespaces controller-runtime makes an informer per namespace without
// saying which is which, and decodes them itself.
func newCache(cfg *config.Config, selector labels.Selector) cache.NewCacheFunc {
	switch len(cfg.Namespaces) {
	case 0:
		return studentwatch.NewCache("", selector)
	case 1:
		return studentwatch.NewCache(cfg.Namespaces[0], selector)
	}
	return cache.New
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
