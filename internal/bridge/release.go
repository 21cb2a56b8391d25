package bridge

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/scheme"
	"github.com/student-bridge/student-bridge/internal/shards"
	"github.com/student-bridge/student-bridge/reconciler"
)

// leaseNamespace is where the leader election Lease lives: the configured
// namespace, else the pod's own in-cluster, else "default".
func leaseNamespace(cfg *config.Config) string {
	if cfg.LeaderElection.Namespace != "" {
		return cfg.LeaderElection.Namespace
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		return strings.TrimSpace(string(b))
	}
	return "default"
}

// ReleaseFinalizers is what uninstalling the bridge needs: once no bridge
// runs any more (the leader election Lease, or with shards every shard and
// member Lease, is free, waited for up to wait), it removes the bridge's
// finalizer from every Student in the configured scope, so that none is
// left undeletable, and deletes the free Leases. It returns how many
// Students it released.
//
// A Student deleted after this is not lost for consumers: a bridge
// installed again publishes its deletion from its record, with the last
// state it published.
func ReleaseFinalizers(ctx context.Context, cfg *config.Config, restCfg *rest.Config, wait time.Duration) (int, error) {
	log := ctrl.Log.WithName("release-finalizers")
	c, err := client.New(restCfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		return 0, err
	}
	// The Leases of every bridge replica: the leader's, or with shards
	// every shard and member Lease.
	read := func(ctx context.Context) ([]coordinationv1.Lease, error) {
		key := types.NamespacedName{Namespace: leaseNamespace(cfg), Name: cfg.LeaderElection.ID}
		var lease coordinationv1.Lease
		err := c.Get(ctx, key, &lease)
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read Lease %s: %w", key, err)
		}
		return []coordinationv1.Lease{lease}, nil
	}
	if cfg.Shards.Count > 1 {
		read = func(ctx context.Context) ([]coordinationv1.Lease, error) {
			var list coordinationv1.LeaseList
			if err := c.List(ctx, &list, client.InNamespace(leaseNamespace(cfg)), client.MatchingLabels{shards.LabelBridge: cfg.LeaderElection.ID}); err != nil {
				return nil, fmt.Errorf("list the shard Leases: %w", err)
			}
			return list.Items, nil
		}
	}
	var leases []coordinationv1.Lease
	if cfg.LeaderElection.Enabled || cfg.Shards.Count > 1 {
		if leases, err = waitUntilFree(ctx, read, wait, cfg.LeaderElection.RetryPeriod); err != nil {
			return 0, err
		}
	}
	selector := labels.Everything()
	if cfg.LabelSelector != "" {
		if selector, err = labels.Parse(cfg.LabelSelector); err != nil {
			return 0, fmt.Errorf("config key labelSelector: %w", err)
		}
	}
	namespaces := cfg.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{""}
	}
	released := 0
	for _, ns := range namespaces {
		n, err := releaseNamespace(ctx, c, ns, selector, releasePage)
		released += n
		if err != nil {
			return released, err
		}
	}
	for i := range leases {
		// Conditional on the resourceVersion read as free: a bridge that
		// took the Lease since keeps it.
		lease := &leases[i]
		err := c.Delete(ctx, lease, client.Preconditions{ResourceVersion: &lease.ResourceVersion})
		if err != nil && !apierrors.IsNotFound(err) {
			return released, fmt.Errorf("delete Lease %s/%s: %w", lease.Namespace, lease.Name, err)
		}
	}
	log.Info("released Students", "count", released)
	return released, nil
}

// waitUntilFree returns the Leases read returns once none of them is held
// (no holder, or one that did not renew it for its duration), waiting up
// to wait.
func waitUntilFree(ctx context.Context, read func(context.Context) ([]coordinationv1.Lease, error), wait, poll time.Duration) ([]coordinationv1.Lease, error) {
	deadline := time.Now().Add(wait)
	for {
		leases, err := read(ctx)
		if err != nil {
			return nil, err
		}
		held := ""
		holders := shards.Holders(leases, time.Now())
		for i := range leases {
			if h := holders[leases[i].Name]; h != "" {
				held = fmt.Sprintf("Lease %s/%s is held by %q", leases[i].Namespace, leases[i].Name, h)
				break
			}
		}
		if held == "" {
			return leases, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("a bridge still runs: %s; stop every bridge replica first (it would add its finalizer again)", held)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(poll):
		}
	}
}

// releasePage is how many Students release-finalizers lists at a time.
const releasePage = 500

// releaseNamespace removes the finalizer from the Students of ns ("" is
// every namespace) that match selector, page Students at a time.
func releaseNamespace(ctx context.Context, c client.Client, ns string, selector labels.Selector, page int64) (int, error) {
	released := 0
	cont := ""
	for {
		var list studentv1.StudentList
		if err := c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: selector}, client.Limit(page), client.Continue(cont)); err != nil {
			return released, fmt.Errorf("list Students: %w", err)
		}
		for i := range list.Items {
			stu := &list.Items[i]
			if !controllerutil.ContainsFinalizer(stu, studentv1.Finalizer) {
				continue
			}
			if err := removeFinalizer(ctx, c, stu); err != nil {
				return released, fmt.Errorf("remove the finalizer of %s/%s: %w", stu.Namespace, stu.Name, err)
			}
			released++
		}
		if cont = list.Continue; cont == "" {
			return released, nil
		}
	}
}

// removeFinalizer removes the bridge's finalizer from stu; a Student gone
// meanwhile needs nothing.
func removeFinalizer(ctx context.Context, c client.Client, stu *studentv1.Student) error {
	err := reconciler.PatchFinalizers(ctx, c, c, stu, 10, func(s *studentv1.Student) bool {
		return controllerutil.RemoveFinalizer(s, studentv1.Finalizer)
	})
	return client.IgnoreNotFound(err)
}
