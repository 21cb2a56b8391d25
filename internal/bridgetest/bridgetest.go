// Package bridgetest runs a bridge for the tests of the packages around it
// (consumer, examples): a namespace of the test's own, watched by a bridge
// with its own stream and buckets on the stack's NATS server, removed when
// the test ends.
package bridgetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/bridge"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/stack"
)

// World is a running bridge and what it watches.
type World struct {
	// Namespace is the one namespace the bridge watches.
	Namespace string
	Config    *config.Config
	// NC is a connection to the stack's NATS server without credentials.
	NC *nats.Conn
	// Stop stops the bridge (also at the end of the test).
	Stop func()
}

// Start runs a bridge in a new namespace named after prefix; subjects,
// stream and buckets are named after prefix too. expected are the services
// it expects receipts from.
func Start(t *testing.T, st *stack.Stack, prefix string, expected ...string) *World {
	t.Helper()
	return StartWith(t, st, prefix, func(cfg *config.Config) { cfg.Services.Expected = expected })
}

// StartWith is Start with the configuration changed by tweak first.
func StartWith(t *testing.T, st *stack.Stack, prefix string, tweak func(*config.Config)) *World {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := st.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.New(nil).Load("")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Namespaces = []string{ns.Name}
	cfg.NATS.URLs = st.NATS.URL()
	cfg.NATS.SubjectPrefix = prefix
	cfg.NATS.Stream.Name = "S_" + prefix
	cfg.State.Bucket = "R_" + prefix
	cfg.Receipts.Bucket = "RC_" + prefix
	cfg.Snapshot.RequestSubject = "snapshot." + prefix
	cfg.LeaderElection.Enabled = false
	cfg.MetricsAddr, cfg.HealthAddr = "0", "0"
	cfg.Retry.BaseDelay, cfg.Retry.MaxDelay = 50*time.Millisecond, 500*time.Millisecond
	cfg.KubeAPIQPS, cfg.KubeAPIBurst = 1000, 2000
	if tweak != nil {
		tweak(cfg)
	}
	nc, err := nats.Connect(st.NATS.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- bridge.Run(runCtx, cfg, st.RestConfig) }()
	var once sync.Once
	w := &World{Namespace: ns.Name, Config: cfg, NC: nc}
	w.Stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("bridge: %v", err)
			}
		})
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.Stop()
		_ = js.DeleteStream(ctx, cfg.NATS.Stream.Name)
		for _, b := range []string{cfg.State.Bucket, cfg.Receipts.Bucket} {
			_ = js.DeleteKeyValue(ctx, b)
		}
	})
	if err := stack.Eventually(30*time.Second, func() error {
		_, err := js.KeyValue(ctx, cfg.Receipts.Bucket)
		return err
	}); err != nil {
		t.Fatalf("the bridge created no receipts bucket: %v", err)
	}
	return w
}

// Patch changes the Student named like s as kubectl edit would: read it,
// apply change, send a merge patch. A merge patch carries no resourceVersion,
// so it cannot conflict with the bridge writing the Student's status or
// finalizer meanwhile (an Update of a copy read earlier can). s is left
// holding the patched Student.
func Patch(t *testing.T, c client.Client, s *studentv1.Student, change func(*studentv1.Student)) {
	t.Helper()
	ctx := context.Background()
	if err := c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
		t.Fatal(err)
	}
	orig := s.DeepCopy()
	change(s)
	if err := c.Patch(ctx, s, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
}
