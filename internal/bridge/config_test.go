package bridge_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/student-bridge/student-bridge/internal/bridge"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// runUntilError runs the bridge and returns the error it stops with; it
// fails the test if the bridge is still running after timeout.
func runUntilError(t *testing.T, cfg *config.Config, timeout time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- bridge.Run(ctx, cfg, st.RestConfig) }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		cancel()
		t.Logf("stopped by the test: %v", <-done)
		t.Fatalf("the bridge still runs after %s", timeout)
		return nil
	}
}

// TestNotReadyWithoutItsStream: with nats.stream.create off and no stream,
// the bridge is live but not ready (its nats check fails); once the
// stream is made it is ready, and publishes (docs/operations.md: ready only
// while NATS is connected and the stream is in place).
func TestNotReadyWithoutItsStream(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "nostream")
	cfg.NATS.Stream.Create = false
	cfg.HealthAddr = fmt.Sprintf("127.0.0.1:%d", stacktest.FreePorts(t, 1))
	startBridge(t, cfg)
	get := func(path string) (int, string, error) {
		resp, err := http.Get("http://" + cfg.HealthAddr + path + "?verbose")
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	// Live, and the stream setup has been tried (and refused) once.
	stacktest.WaitFor(t, "live", func() error {
		code, _, err := get("/healthz")
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("/healthz %d", code)
		}
		return err
	})
	stacktest.WaitFor(t, "not ready, for want of the stream", func() error {
		code, body, err := get("/readyz")
		if err == nil && (code == http.StatusOK || !strings.Contains(body, "[-]nats failed")) {
			err = fmt.Errorf("/readyz %d: %s", code, body)
		}
		return err
	})
	js, err := jetstream.New(natsConn(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.NATS.Stream.Name, Subjects: []string{"nostream.>"}, Storage: jetstream.MemoryStorage, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, "ready once the stream is there", func() error {
		code, body, err := get("/readyz")
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("/readyz %d: %s", code, body)
		}
		return err
	})
	if err := st.Client.Create(ctx, newStudent(ns, "a", "wang", "china")); err != nil {
		t.Fatal(err)
	}
	waitStream(t, natsConn(t), cfg.NATS.Stream.Name, 1)
}

// TestExistingStreamAndBucketNeverChanged: a stream the operator made with
// other limits keeps them; a bucket whose keys expire is refused at startup
// with an error naming records.bucket.
func TestExistingStreamAndBucketNeverChanged(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "owned")
	js, err := jetstream.New(natsConn(t))
	if err != nil {
		t.Fatal(err)
	}
	want := jetstream.StreamConfig{Name: cfg.NATS.Stream.Name, Subjects: []string{"owned.>"}, Storage: jetstream.MemoryStorage,
		MaxAge: time.Hour, MaxMsgs: 100, Duplicates: time.Minute}
	if _, err := js.CreateStream(ctx, want); err != nil {
		t.Fatal(err)
	}
	stop := startBridge(t, cfg)
	nc := natsConn(t)
	if err := st.Client.Create(ctx, newStudent(ns, "a", "wang", "china")); err != nil {
		t.Fatal(err)
	}
	waitStream(t, nc, cfg.NATS.Stream.Name, 1)
	stop()
	s, err := js.Stream(ctx, cfg.NATS.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	got := s.CachedInfo().Config
	if got.MaxAge != want.MaxAge || got.MaxMsgs != want.MaxMsgs || got.Duplicates != want.Duplicates || got.Storage != want.Storage {
		t.Errorf("the bridge changed the existing stream: %+v", got)
	}

	ttl := testConfig(t, ns, "ttl")
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: ttl.Records.Bucket, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := runUntilError(t, ttl, 30*time.Second); err == nil || !strings.Contains(err.Error(), "records.bucket") {
		t.Errorf("a bucket with a TTL: %v, want an error naming records.bucket", err)
	}
}

// TestNATSMaxReconnects: a connection that gave up stops the bridge with an
// error naming nats.maxReconnects.
func TestNATSMaxReconnects(t *testing.T) {
	n, err := stack.StartNATS(stack.NATSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, newNamespace(t), "giveup")
	cfg.NATS.URLs = n.URL()
	cfg.NATS.MaxReconnects = 2
	done := make(chan error, 1)
	go func() { done <- runUntilError(t, cfg, 60*time.Second) }()
	// Connected and set up: the stream exists on the server.
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, "the bridge's stream", func() error {
		_, err := js.Stream(context.Background(), cfg.NATS.Stream.Name)
		return err
	})
	nc.Close()
	n.Stop()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "nats.maxReconnects") {
		t.Errorf("after NATS went away for good: %v, want an error naming nats.maxReconnects", err)
	}
}

// TestCoreModeAtMostOnce: on core NATS a connected subscriber gets the
// event, one that connects later gets only later changes, and no stream is
// created.
func TestCoreModeAtMostOnce(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "core")
	cfg.NATS.Mode = "core"
	startBridge(t, cfg)
	nc := natsConn(t)
	early, err := stacktest.Subscribe(nc, "core.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Client.Create(ctx, newStudent(ns, "a", "wang", "china")); err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, "the early subscriber gets a's created", func() error { return count(early, 1) })
	late, err := stacktest.Subscribe(nc, "core.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Client.Create(ctx, newStudent(ns, "b", "li", "peking")); err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, "both subscribers get b's created", func() error {
		if err := count(early, 2); err != nil {
			return err
		}
		return count(late, 1)
	})
	if got, _ := late.Events(); got[0].Data.Metadata.Name != "b" {
		t.Errorf("the late subscriber got %v, want only b", types(got))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(ctx, cfg.NATS.Stream.Name); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("core mode created stream %s (%v)", cfg.NATS.Stream.Name, err)
	}
}

func count(s *stacktest.Subscription, want int) error {
	got, err := s.Events()
	if err != nil {
		return err
	}
	if len(got) != want {
		return fmt.Errorf("%d events, want %d: %v", len(got), want, types(got))
	}
	return nil
}

// counter sums the counter series of name whose labels include match.
func counter(t *testing.T, name string, match map[string]string) float64 {
	t.Helper()
	families, err := metrics.Registry.(prometheus.Gatherer).Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if hasLabels(m, match) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, match map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := match[l.GetName()]; ok && v == l.GetValue() {
			n++
		}
	}
	return n == len(match)
}

// TestFleetNeedsItsClustersDomain: a bridge of a fleet whose NATS is not in
// the JetStream domain of its cluster's name (here: in none) stops at
// startup naming the cluster key, rather than publishing into a stream the
// hub never sources.
func TestFleetNeedsItsClustersDomain(t *testing.T) {
	cfg := testConfig(t, newNamespace(t), "nodomain")
	cfg.Cluster, cfg.Fleet.HubDomain = "east", "hub"
	err := runUntilError(t, cfg, 30*time.Second)
	if err == nil || !strings.Contains(err.Error(), "config key cluster") || !strings.Contains(err.Error(), "JetStream domain") {
		t.Fatalf("bridge stopped with %v, want an error naming the cluster key and the domain", err)
	}
}
