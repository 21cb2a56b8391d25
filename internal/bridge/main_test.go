package bridge_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/bridge"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/stack"
)

var st *stack.Stack

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapLevel()), zap.StacktraceLevel(zapcore.PanicLevel)))
	os.Exit(stack.RunTests(m, stack.Options{}, func(s *stack.Stack) { st = s }))
}

// zapLevel keeps test output to errors unless BRIDGE_TEST_VERBOSE is set.
func zapLevel() zapcore.Level {
	if os.Getenv("BRIDGE_TEST_VERBOSE") != "" {
		return zapcore.DebugLevel
	}
	return zapcore.ErrorLevel
}

var nsCounter atomic.Int32

// newNamespace creates a namespace of the test's own.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("t%d-%d", nsCounter.Add(1), time.Now().UnixNano()%100000)}}
	if err := st.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// testConfig is the default configuration, pointed at the test stack and
// watching one namespace, with short retry delays.
func testConfig(t *testing.T, ns, prefix string) *config.Config {
	t.Helper()
	cfg, err := config.New(nil).Load("")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Cluster = "test"
	cfg.Namespaces = []string{ns}
	cfg.NATS.URLs = st.NATS.URL()
	cfg.NATS.SubjectPrefix = prefix
	cfg.NATS.Stream.Name = "S_" + prefix
	cfg.State.Bucket = "R_" + prefix
	cfg.Receipts.Bucket = "RC_" + prefix
	cfg.NATS.ReconnectWait = 100 * time.Millisecond
	cfg.NATS.AckTimeout = 2 * time.Second
	cfg.LeaderElection.Enabled = false
	cfg.MetricsAddr = "0"
	cfg.HealthAddr = "0"
	cfg.Retry.BaseDelay = 50 * time.Millisecond
	cfg.Retry.MaxDelay = 500 * time.Millisecond
	cfg.ShutdownTimeout = 10 * time.Second
	// The stream and the record store outlive the bridge on the shared
	// server: remove them, so a second round of the tests (-count=2) starts
	// from nothing.
	t.Cleanup(func() { deleteStreamAndBucket(t, cfg.NATS.Stream.Name, cfg.State.Bucket, cfg.Receipts.Bucket) })
	return cfg
}

func deleteStreamAndBucket(t *testing.T, stream string, buckets ...string) {
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

// startBridge runs the bridge until the returned stop is called (or the
// test ends) and fails the test if Run returned an error.
func startBridge(t *testing.T, cfg *config.Config) (stop func()) {
	t.Helper()
	return startBridgeWith(t, cfg, st.RestConfig)
}

// startBridgeWith is startBridge with a rest config of the caller's.
func startBridgeWith(t *testing.T, cfg *config.Config, restCfg *rest.Config) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- bridge.Run(ctx, cfg, restCfg) }()
	var stopped atomic.Bool
	stop = func() {
		if stopped.Swap(true) {
			return
		}
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("bridge.Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("bridge did not stop within 30s")
		}
	}
	t.Cleanup(stop)
	return stop
}

func natsConn(t *testing.T) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(st.NATS.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func newStudent(ns, name, student, school string) *studentv1.Student {
	return &studentv1.Student{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       studentv1.StudentSpec{Name: student, School: school},
	}
}

// waitStream waits until the stream holds want events and returns them; it
// fails if more arrive.
func waitStream(t *testing.T, nc *nats.Conn, stream string, want int) []stack.Received {
	t.Helper()
	var got []stack.Received
	err := stack.Eventually(30*time.Second, func() error {
		var err error
		got, err = stack.StreamEvents(context.Background(), nc, stream)
		if err != nil {
			return err
		}
		if len(got) != want {
			return fmt.Errorf("stream %s holds %d events, want %d: %v", stream, len(got), want, types(got))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func types(rs []stack.Received) []string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprintf("%s:%s", r.Data.Metadata.Name, r.Event.Type()))
	}
	return out
}

// kubeEvents lists the events.k8s.io Events regarding a Student.
func kubeEvents(t *testing.T, ns, name string) []eventsv1.Event {
	t.Helper()
	var list eventsv1.EventList
	if err := st.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Name == name && e.Regarding.Kind == "Student" {
			out = append(out, e)
		}
	}
	return out
}

func getStudent(t *testing.T, ns, name string) *studentv1.Student {
	t.Helper()
	var s studentv1.Student
	if err := st.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

func publishedCondition(s *studentv1.Student) *metav1.Condition {
	return meta.FindStatusCondition(s.Status.Conditions, studentv1.ConditionPublished)
}
