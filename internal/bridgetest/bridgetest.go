// Package bridgetest runs bridges in tests, one way for every package:
// Config and Run for the bridge's own tests, Start for the packages around
// it (deploy, examples): a namespace of the test's own, watched by a
// bridge with its own stream and buckets on the stack's NATS server,
// removed when the test ends.
package bridgetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/bridge"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
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
	ns := stacktest.Namespace(t, st.Client, prefix)
	cfg := Config(t, st, ns, prefix)
	cfg.Snapshot.RequestSubject = "snapshot." + prefix
	cfg.KubeAPIQPS, cfg.KubeAPIBurst = 1000, 2000
	if tweak != nil {
		tweak(cfg)
	}
	nc, err := nats.Connect(st.NATS.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	w := &World{Namespace: ns, Config: cfg, NC: nc, Stop: Run(t, cfg, st.RestConfig)}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, "the bridge creating its receipts bucket", func() error {
		_, err := js.KeyValue(context.Background(), cfg.Receipts.Bucket)
		return err
	})
	return w
}

// Config is the configuration of a bridge under test: the defaults, pointed
// at st's NATS server and watching namespace ns only, with subjects, a
// stream and buckets named after prefix (removed when the test ends, so a
// second round of the tests, -count=2, starts from nothing), short retry
// delays and timeouts, cluster "test", no leader election and no ports.
func Config(t testing.TB, st *stack.Stack, ns, prefix string) *config.Config {
	t.Helper()
	cfg, err := config.NewLoader(nil, config.BridgeCommand).Load("")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Cluster = "test"
	cfg.Namespaces = []string{ns}
	cfg.NATS.URLs = st.NATS.URL()
	cfg.NATS.SubjectPrefix = prefix
	cfg.NATS.Stream.Name = "S_" + prefix
	cfg.Records.Bucket = "R_" + prefix
	cfg.Receipts.Bucket = "RC_" + prefix
	cfg.NATS.ReconnectWait = 100 * time.Millisecond
	cfg.NATS.AckTimeout = 2 * time.Second
	cfg.LeaderElection.Enabled = false
	cfg.MetricsAddr, cfg.HealthAddr = "0", "0"
	cfg.Retry.BaseDelay, cfg.Retry.MaxDelay = 50*time.Millisecond, 500*time.Millisecond
	cfg.ShutdownTimeout = 10 * time.Second
	t.Cleanup(func() { DeleteStreamAndBuckets(t, st, cfg.NATS.Stream.Name, cfg.Records.Bucket, cfg.Receipts.Bucket) })
	return cfg
}

// DeleteStreamAndBuckets removes a stream and buckets from st's NATS
// server; what is not there is no error.
func DeleteStreamAndBuckets(t testing.TB, st *stack.Stack, stream string, buckets ...string) {
	t.Helper()
	nc, err := nats.Connect(st.NATS.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(context.Background(), stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("delete stream %s: %v", stream, err)
	}
	for _, bucket := range buckets {
		if err := js.DeleteKeyValue(context.Background(), bucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			t.Errorf("delete bucket %s: %v", bucket, err)
		}
	}
}

// Run runs a bridge with cfg against restCfg until the returned stop is
// called (or the test ends). stop fails the test if Run returned an error
// or did not stop within 30 s.
func Run(t testing.TB, cfg *config.Config, restCfg *rest.Config) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- bridge.Run(ctx, cfg, restCfg) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("bridge.Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("bridge did not stop within 30s")
			}
		})
	}
	t.Cleanup(stop)
	return stop
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
