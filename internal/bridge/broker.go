package bridge

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/internal/records"
	"github.com/student-bridge/student-bridge/reconciler"
	"github.com/student-bridge/student-bridge/sink"
)

// setupTimeout bounds looking up (or creating) a stream or a bucket.
const setupTimeout = 10 * time.Second

// retry calls attempt until it succeeds, ctx ends or attempt returns an
// error wrapping one of fatal, waiting from 500ms doubling to 30s between
// attempts. It returns nil when ctx ended.
func retry(ctx context.Context, log logr.Logger, what string, attempt func(context.Context) error, fatal ...error) error {
	delay := 500 * time.Millisecond
	for {
		err := attempt(ctx)
		if err == nil {
			return nil
		}
		for _, f := range fatal {
			if errors.Is(err, f) {
				return err
			}
		}
		log.Info(what+" failed; retrying", "reason", err.Error(), "in", delay.String())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
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
		Records:    recordsSubject(cfg),
	}
}

// recordsSubject is the subject prefix of the records in the stream, if
// they live there.
func recordsSubject(cfg *config.Config) string {
	if cfg.Records.Store != config.RecordsInStream {
		return ""
	}
	return natssink.RecordsSubject(cfg.NATS.SubjectPrefix)
}

// streamEnsurer makes sure the stream exists and captures our subjects. It
// retries while NATS is unreachable and stops the bridge when the stream
// exists but does not capture our subjects: that needs an operator.
type streamEnsurer struct {
	nc     *nats.Conn
	cfg    natssink.StreamConfig
	create bool
	// domain, in a fleet, is the JetStream domain the stream must be in:
	// the cluster's name, by which the hub sources it.
	domain string
	log    logr.Logger
	ready  atomic.Bool
}

// errWrongDomain stops the bridge: its NATS is not its cluster's.
var errWrongDomain = errors.New("config key cluster")

// NeedLeaderElection is false: standbys report readiness too.
func (s *streamEnsurer) NeedLeaderElection() bool { return false }

func (s *streamEnsurer) Start(ctx context.Context) error {
	js, err := jetstream.New(s.nc)
	if err != nil {
		return err
	}
	return retry(ctx, s.log, "stream setup", func(ctx context.Context) error {
		if !s.nc.IsConnected() {
			return fmt.Errorf("NATS %s", s.nc.Status())
		}
		ctx, cancel := context.WithTimeout(ctx, setupTimeout)
		defer cancel()
		if s.domain != "" {
			acct, err := js.AccountInfo(ctx)
			if err != nil {
				return err
			}
			if acct.Domain != s.domain {
				return fmt.Errorf("%w: %q, but the NATS the bridge connects to is in JetStream domain %q; in a fleet (fleet.hubDomain) each cluster's NATS has the cluster's name as its domain (docs/fleet.md)",
					errWrongDomain, s.domain, acct.Domain)
			}
		}
		info, err := natssink.EnsureStream(ctx, js, s.cfg, s.create)
		if err != nil {
			return err
		}
		s.ready.Store(true)
		s.log.Info("stream ready", "stream", info.Config.Name, "subjects", info.Config.Subjects, "messages", info.State.Msgs)
		return nil
	}, natssink.ErrStreamConflict, errWrongDomain)
}

// recordLoader opens the record store when this replica becomes leader,
// loads it and then queues the records whose Students the cache does not
// have: deleted, or out of scope, while no bridge ran.
type recordLoader struct {
	nc    *nats.Conn
	pub   *natssink.Publisher
	mover *natssink.Mover
	cfg   *config.Config
	// selector is cfg.LabelSelector, parsed.
	selector labels.Selector
	mgr      manager.Manager
	r        *reconciler.StudentReconciler
	recs     *records.Set
	log      logr.Logger
}

// NeedLeaderElection is true: only the leader publishes and writes records.
func (l *recordLoader) NeedLeaderElection() bool { return true }

func (l *recordLoader) Start(ctx context.Context) error {
	// The start's catch-up is not over before the records of Students
	// gone meanwhile are queued.
	defer l.r.HoldCatchUp()()
	// The records load while the cache syncs: a restart waits for the
	// longer of the two, not for both in turn.
	bucket := natssink.BucketConfig{Name: l.cfg.Records.Bucket, Storage: l.cfg.Records.Storage, Replicas: l.cfg.Records.Replicas, Timeout: l.cfg.NATS.AckTimeout, Mover: l.mover}
	var (
		kv    *natssink.KV
		store sink.Store
		where = "bucket " + bucket.Name
		key   = "records.bucket"
	)
	if subject := recordsSubject(l.cfg); subject != "" {
		where, key = "stream "+l.cfg.NATS.Stream.Name+" under "+subject, "records.store"
	}
	err := retry(ctx, l.log, "record store load", func(ctx context.Context) error {
		if !l.nc.IsConnected() {
			return fmt.Errorf("NATS %s", l.nc.Status())
		}
		if l.cfg.Records.Store == config.RecordsInStream {
			var err error
			store, err = natssink.NewStreamRecords(l.pub, l.cfg.NATS.Stream.Name, l.cfg.NATS.SubjectPrefix, l.mover)
			if err != nil {
				return err
			}
		} else {
			// A lookup or a create is one JetStream API request: one that got
			// lost (a cluster busy electing or creating) is asked again soon.
			setup, cancel := context.WithTimeout(ctx, setupTimeout)
			var err error
			kv, err = natssink.EnsureBucket(setup, l.nc, bucket, l.cfg.Records.Create)
			cancel()
			if err != nil {
				return err
			}
			store = kv
		}
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := checkShardCount(ctx, store, l.cfg.Shards.Count); err != nil {
			return err
		}
		start := time.Now()
		if err := l.recs.Load(ctx, store); err != nil {
			return err
		}
		l.log.Info("record store loaded", "in", where, "records", l.recs.Len(), "took", time.Since(start).String())
		return nil
	}, natssink.ErrBucketShape, errShardCount)
	if errors.Is(err, errShardCount) {
		return err
	}
	if err != nil {
		return fmt.Errorf("config key %s: %w", key, err)
	}
	if ctx.Err() != nil {
		return nil
	}
	if kv != nil {
		go purgeDeleteMarkers(ctx, kv, l.cfg.Records.DeleteMarkerAge, l.log)
	}
	if !reconciler.WaitForStudents(ctx, l.mgr.GetCache()) {
		return nil
	}
	changed, gone, err := l.r.CatchUp(ctx, l.mgr.GetClient())
	if err != nil && ctx.Err() == nil {
		return err
	}
	if changed > 0 || gone > 0 {
		l.log.Info("catching up with what changed while no bridge ran, first", "changed", changed, "gone", gone)
	}
	return nil
}

// purgeDeleteMarkers purges the delete markers older than age from a
// bucket (the record store's, the receipts') now and every age, until ctx
// ends. Each removed record or receipt leaves one: purged only at a
// start, they would pile up, one per deleted Student, in a bridge that
// runs for days.
func purgeDeleteMarkers(ctx context.Context, kv *natssink.KV, age time.Duration, log logr.Logger) {
	tick := time.NewTicker(age)
	defer tick.Stop()
	for {
		if err := kv.PurgeDeleteMarkers(ctx, age); err != nil && ctx.Err() == nil {
			log.Info("purging the delete markers of a bucket failed; tried again later", "reason", err.Error(), "in", age.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// connectionWatch stops the bridge once its NATS connection gave up
// reconnecting (nats.maxReconnects): a bridge that can never publish again
// should exit and be restarted, not stay up unready forever.
type connectionWatch struct {
	nc            *nats.Conn
	maxReconnects int
}

// NeedLeaderElection is false: a standby's connection matters too.
func (w connectionWatch) NeedLeaderElection() bool { return false }

func (w connectionWatch) Start(ctx context.Context) error {
	// Told, not polled: nothing wakes the bridge for this until it closes.
	closed := w.nc.StatusChanged(nats.CLOSED)
	defer w.nc.RemoveStatusListener(closed)
	if !w.nc.IsClosed() { // or it closed before the listener was there
		select {
		case <-ctx.Done():
			return nil
		case <-closed:
		}
	}
	return fmt.Errorf("the NATS connection gave up after %d reconnection attempts (config key nats.maxReconnects)", w.maxReconnects)
}
