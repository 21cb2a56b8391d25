package bridge_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zapcore"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/bridgetest"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

var st *stack.Stack

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapLevel()), zap.StacktraceLevel(zapcore.PanicLevel)))
	os.Exit(stacktest.RunTests(m, stack.Options{}, func(s *stack.Stack) { st = s }))
}

// zapLevel keeps test output to errors unless BRIDGE_TEST_VERBOSE is set.
func zapLevel() zapcore.Level {
	if os.Getenv("BRIDGE_TEST_VERBOSE") != "" {
		return zapcore.DebugLevel
	}
	return zapcore.ErrorLevel
}

// newNamespace creates a namespace of the test's own.
func newNamespace(t *testing.T) string { return stacktest.Namespace(t, st.Client, "t") }

// testConfig is bridgetest.Config on this package's stack.
func testConfig(t *testing.T, ns, prefix string) *config.Config {
	return bridgetest.Config(t, st, ns, prefix)
}

// startBridge runs a bridge on this package's stack until the returned stop
// is called (or the test ends); see bridgetest.Run.
func startBridge(t *testing.T, cfg *config.Config) (stop func()) {
	return bridgetest.Run(t, cfg, st.RestConfig)
}

func natsConn(t *testing.T) *nats.Conn {
	t.Helper()
	return stacktest.Connect(t, st.NATS.URL())
}

func newStudent(ns, name, student, school string) *studentv1.Student {
	return &studentv1.Student{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       studentv1.StudentSpec{Name: student, School: school},
	}
}

// createStudents creates n Students in ns, named by format from their
// index (s%d: s0, s1, ...), all "wang" of "china".
func createStudents(t *testing.T, ns, format string, n int) {
	t.Helper()
	for i := range n {
		if err := st.Client.Create(context.Background(), newStudent(ns, fmt.Sprintf(format, i), "wang", "china")); err != nil {
			t.Fatal(err)
		}
	}
}

// openStream returns JetStream on nc and its stream name.
func openStream(t *testing.T, nc *nats.Conn, name string) (jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return js, stream
}

// waitStream waits until the stream holds want events and returns them; it
// fails if more arrive.
func waitStream(t *testing.T, nc *nats.Conn, stream string, want int) []stacktest.Received {
	t.Helper()
	var got []stacktest.Received
	err := stacktest.Eventually(30*time.Second, func() error {
		var err error
		got, err = stacktest.StreamEvents(context.Background(), nc, stream)
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

func types(rs []stacktest.Received) []string {
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
