// Package bridge wires the configured parts of student-bridge together: the
// NATS connection, the JetStream stream, the controller-runtime manager and
// the Student reconciler. cmd/student-bridge, the local dev stack and the
// process-level tests all start the bridge through Run.
package bridge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/natsconn"
	"github.com/student-bridge/student-bridge/internal/kubeevents"
	"github.com/student-bridge/student-bridge/reconciler"
	"github.com/student-bridge/student-bridge/sink/natssink"
)

// Scheme knows the built-in Kubernetes types and Student.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(studentv1.AddToScheme(s))
	return s
}

// Run runs the bridge until ctx is cancelled, then shuts down gracefully:
// in-flight publishes and status writes finish (bounded by
// cfg.ShutdownTimeout) before the NATS connection is drained.
func Run(ctx context.Context, cfg *config.Config, restCfg *rest.Config) error {
	log := ctrl.Log.WithName("bridge")
	log.Info("starting", "nats", config.Redacted(cfg.NATS.URLs), "mode", cfg.NATS.Mode, "encoding", cfg.NATS.Encoding,
		"stream", cfg.NATS.Stream.Name, "cluster", cfg.Cluster, "namespaces", cfg.Namespaces, "leaderElection", cfg.LeaderElection.Enabled)

	layout, err := natssink.NewSubjectLayout(cfg.NATS.SubjectPrefix, cfg.NATS.SubjectLayout)
	if err != nil {
		return fmt.Errorf("config key nats.subjectLayout: %w", err)
	}

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

	pcfg := natssink.Config{
		Mode:       natssink.Mode(cfg.NATS.Mode),
		Encoding:   natssink.Encoding(cfg.NATS.Encoding),
		Layout:     layout,
		AckTimeout: cfg.NATS.AckTimeout,
	}
	if pcfg.Mode == natssink.JetStream {
		// An ack from another stream that happens to capture the subject
		// is not the store consumers replay from.
		pcfg.Stream = cfg.NATS.Stream.Name
	}
	pub, err := natssink.NewPublisher(nc, pcfg)
	if err != nil {
		return err
	}

	restCfg = rest.CopyConfig(restCfg)
	restCfg.QPS, restCfg.Burst = cfg.KubeAPIQPS, cfg.KubeAPIBurst
	mgr, err := newManager(cfg, restCfg)
	if err != nil {
		return err
	}

	stream := &streamEnsurer{nc: nc, cfg: streamConfig(cfg, layout), create: cfg.NATS.Stream.Create, log: log.WithName("stream")}
	if cfg.NATS.Mode == string(natssink.JetStream) {
		if err := mgr.Add(stream); err != nil {
			return err
		}
	} else {
		stream.ready.Store(true)
	}

	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("nats", func(*http.Request) error {
		switch {
		case !nc.IsConnected():
			return fmt.Errorf("NATS %s", nc.Status())
		case !stream.ready.Load():
			return fmt.Errorf("stream %s not ready", cfg.NATS.Stream.Name)
		}
		return nil
	}); err != nil {
		return err
	}

	r := &reconciler.StudentReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Sink:      pub,
		Recorder:  nopRecorder{},
		Cluster:   cfg.Cluster,
		Timeout:   cfg.NATS.AckTimeout + 30*time.Second,
	}
	if cfg.KubernetesEvents {
		rec, err := kubeevents.New(mgr.GetClient(), mgr.GetScheme(), kubeevents.Options{
			Controller: reconciler.ControllerName,
			QPS:        cfg.KubernetesEventsQPS,
			Log:        log.WithName("events"),
			// Every worker busy: changes are waiting for the API server,
			// and Events would only take capacity from them.
			Busy: func() bool { return r.InFlight() >= cfg.Workers },
		})
		if err != nil {
			return err
		}
		if err := mgr.Add(rec); err != nil {
			return err
		}
		r.Recorder = rec
	}
	skip := true
	if err := r.SetupWithManager(mgr, controller.Options{
		MaxConcurrentReconciles: cfg.Workers,
		RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](cfg.Retry.BaseDelay, cfg.Retry.MaxDelay),
		// Tests and the dev stack may run more than one bridge per process.
		SkipNameValidation: &skip,
	}); err != nil {
		return fmt.Errorf("set up controller: %w", err)
	}

	if cfg.Snapshot.OnStartup || cfg.Snapshot.RequestSubject != "" {
		if err := mgr.Add(&snapshotServer{
			nc:         nc,
			cache:      mgr.GetCache(),
			snap:       &reconciler.Snapshotter{Reader: mgr.GetClient(), Sink: pub, Cluster: cfg.Cluster},
			onStartup:  cfg.Snapshot.OnStartup,
			subject:    cfg.Snapshot.RequestSubject,
			namespaces: cfg.Namespaces,
			log:        log.WithName("snapshot"),
		}); err != nil {
			return err
		}
	}

	log.Info("running")
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	log.Info("stopped")
	return nil
}

func newManager(cfg *config.Config, restCfg *rest.Config) (manager.Manager, error) {
	cacheOpts := cache.Options{DefaultTransform: cache.TransformStripManagedFields()}
	if len(cfg.Namespaces) > 0 {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range cfg.Namespaces {
			cacheOpts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	if cfg.LabelSelector != "" {
		sel, err := labels.Parse(cfg.LabelSelector)
		if err != nil {
			return nil, fmt.Errorf("config key labelSelector: %w", err)
		}
		cacheOpts.ByObject = map[client.Object]cache.ByObject{&studentv1.Student{}: {Label: sel}}
	}
	leNamespace := cfg.LeaderElection.Namespace
	if cfg.LeaderElection.Enabled && leNamespace == "" {
		if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
			leNamespace = strings.TrimSpace(string(b))
		} else {
			leNamespace = "default"
		}
	}
	grace := cfg.ShutdownTimeout
	le := cfg.LeaderElection
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                  Scheme(),
		Cache:                   cacheOpts,
		Metrics:                 metricsserver.Options{BindAddress: cfg.MetricsAddr},
		HealthProbeBindAddress:  cfg.HealthAddr,
		PprofBindAddress:        cfg.PprofAddr,
		LeaderElection:          cfg.LeaderElection.Enabled,
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

func streamConfig(cfg *config.Config, layout natssink.SubjectLayout) natssink.StreamConfig {
	s := cfg.NATS.Stream
	return natssink.StreamConfig{
		Name:       s.Name,
		Subject:    layout.StreamSubject(),
		Storage:    s.Storage,
		Replicas:   s.Replicas,
		MaxAge:     s.MaxAge,
		MaxBytes:   s.MaxBytes,
		MaxMsgs:    s.MaxMsgs,
		Discard:    s.Discard,
		Duplicates: s.Duplicates,
	}
}

// streamEnsurer makes sure the stream exists and captures our subjects. It
// retries while NATS is unreachable and stops the bridge when the stream
// exists but does not capture our subjects: that needs an operator.
type streamEnsurer struct {
	nc     *nats.Conn
	cfg    natssink.StreamConfig
	create bool
	log    logr.Logger
	ready  atomic.Bool
}

// NeedLeaderElection is false: standbys report readiness too.
func (s *streamEnsurer) NeedLeaderElection() bool { return false }

func (s *streamEnsurer) Start(ctx context.Context) error {
	js, err := jetstream.New(s.nc)
	if err != nil {
		return err
	}
	delay := 500 * time.Millisecond
	for {
		info, err := s.ensure(ctx, js)
		if err == nil {
			s.ready.Store(true)
			s.log.Info("stream ready", "stream", info.Config.Name, "subjects", info.Config.Subjects, "messages", info.State.Msgs)
			return nil
		}
		if errors.Is(err, natssink.ErrStreamConflict) {
			return err
		}
		s.log.Info("stream not ready; retrying", "stream", s.cfg.Name, "reason", err.Error(), "in", delay.String())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
}

func (s *streamEnsurer) ensure(ctx context.Context, js jetstream.JetStream) (*jetstream.StreamInfo, error) {
	if !s.nc.IsConnected() {
		return nil, fmt.Errorf("NATS %s", s.nc.Status())
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return natssink.EnsureStream(ctx, js, s.cfg, s.create)
}

type nopRecorder struct{}

func (nopRecorder) Eventf(_, _ runtime.Object, _, _, _, _ string, _ ...any) {}

// Leader election needs a Lease in the bridge's own namespace and records its
// transitions as core Events there.
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=student-bridge-system,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=student-bridge-system,resources=events,verbs=create;patch
