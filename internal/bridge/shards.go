package bridge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/records"
	"github.com/student-bridge/student-bridge/internal/scheme"
	"github.com/student-bridge/student-bridge/internal/shards"
	"github.com/student-bridge/student-bridge/reconciler"
	"github.com/student-bridge/student-bridge/sink"
)

// shardsKey holds, in the record store, the number of shards the records
// were written under; it is no Student uid, so loading records skips it.
const shardsKey = "config.shards"

// addShards makes this replica one of several active ones: it publishes,
// writes status and removes finalizers only for the Students of the shards
// whose Leases it holds. reconciled is the reconciler, made after the
// shards (it is given them): the manager's callbacks, which run once the
// manager has started, queue a gained shard's Students with it. parts'
// status writer and recorder get the replica's share of their budgets.
func addShards(mgr manager.Manager, cfg *config.Config, restCfg *rest.Config, recs *records.Set, reconciled func() *reconciler.StudentReconciler, parts *reconcilerParts, log logr.Logger) (*shards.Manager, error) {
	c, err := client.New(restCfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		return nil, err
	}
	count := cfg.Shards.Count
	of := func(key types.NamespacedName) int { return shards.Of(key.Namespace, key.Name, count) }
	in := func(set []int) func(types.NamespacedName) bool {
		return func(key types.NamespacedName) bool { return slices.Contains(set, of(key)) }
	}
	m := shards.New(shards.Options{
		Client: c, Namespace: leaseNamespace(cfg), Name: cfg.LeaderElection.ID, Count: count, Identity: identity(),
		LeaseDuration: cfg.LeaderElection.LeaseDuration, RenewDeadline: cfg.LeaderElection.RenewDeadline, RetryPeriod: cfg.LeaderElection.RetryPeriod,
		Load: func(ctx context.Context, gained []int) error {
			ours := in(gained)
			return recs.ReloadWhere(ctx, func(rec studentv1.StudentRecord) bool {
				return ours(types.NamespacedName{Namespace: rec.Namespace, Name: rec.Name})
			})
		},
		Enqueue: func(ctx context.Context, gained []int) {
			if !reconciler.WaitForStudents(ctx, mgr.GetCache()) {
				return
			}
			if _, err := reconciled().EnqueueShard(ctx, mgr.GetClient(), in(gained)); err != nil && ctx.Err() == nil {
				log.Error(err, "queueing the Students of gained shards", "shards", gained)
			}
		},
		// status.qps and kubernetesEventsQPS are the whole bridge's: each
		// replica takes the share of the shards it holds (one shard's
		// while it holds none).
		Held: func(n int) {
			share := float64(max(n, 1)) / float64(count)
			parts.status.SetQPS(cfg.Status.QPS * share)
			if parts.events != nil {
				parts.events.SetQPS(cfg.KubernetesEventsQPS * share)
			}
		},
		Log: log.WithName("shards"),
	})
	if err := mgr.Add(m); err != nil {
		return nil, err
	}
	// The backlog of the shards held, counted while the bridge runs.
	backlog := &backlogSource{held: m.Held, count: func(ctx context.Context) (map[int]int, error) {
		return reconciled().Unpublished(ctx, mgr.GetClient(), func(key types.NamespacedName) (int, bool) { return of(key), m.Owns(key) })
	}}
	return m, mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		if !reconciler.WaitForStudents(ctx, mgr.GetCache()) {
			return nil
		}
		defer shardBacklog.add(backlog)()
		<-ctx.Done()
		return nil
	}))
}

// errShardCount: the record store was written with another number of
// shards.
var errShardCount = errors.New("shard count differs from the record store's")

// checkShardCount records the number of shards in the record store, or
// refuses to run with another number than the one recorded there.
func checkShardCount(ctx context.Context, store sink.Store, count int) error {
	rec, err := store.Get(ctx, shardsKey)
	switch {
	case errors.Is(err, sink.ErrNotFound):
		_, err = store.Put(ctx, shardsKey, []byte(strconv.Itoa(count)), 0)
		if errors.Is(err, sink.ErrConflict) {
			return checkShardCount(ctx, store, count) // another replica wrote it first
		}
		return err
	case err != nil:
		return err
	}
	if got, _ := strconv.Atoi(string(rec.Value)); got != count {
		return fmt.Errorf("%w: config key shards.count is %d, but the record store was written with %q shards; every replica must use the same (to change it, stop every replica and delete the key %s of the bucket)", errShardCount, count, rec.Value, shardsKey)
	}
	return nil
}

// identity names this replica among the shard Leases: the host (the pod's
// name in a cluster) and a random suffix, so a restarted pod is a new
// member.
func identity() string {
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r - 'A' + 'a'
		}
		return '-'
	}, host)
	if len(host) > 40 {
		host = host[:40]
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return strings.Trim(host, "-") + "-" + hex.EncodeToString(b)
}
