package stacktest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/student-bridge/student-bridge/internal/stack"
)

// Connect connects to the NATS at url for the rest of the test, and
// reconnects quickly and forever, as tests restart and cut servers.
func Connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// NATS starts an embedded NATS server with JetStream for the rest of the
// test and returns a connection to it.
func NATS(t testing.TB) *nats.Conn {
	t.Helper()
	n, err := stack.StartNATS(stack.NATSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	return Connect(t, n.URL())
}

// WaitFor fails t unless cond returns nil within a minute, naming what it
// waited for and cond's last error.
func WaitFor(t testing.TB, what string, cond func() error) {
	t.Helper()
	if err := Eventually(time.Minute, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Namespace creates a namespace of the test's own, named after prefix with
// a suffix the API server picks, and returns its name.
func Namespace(t testing.TB, c client.Client, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// FreePorts returns the first of n consecutive ports nothing listens on
// (stack.FreePorts: below the ephemeral range), failing t if there are none.
func FreePorts(t testing.TB, n int) int {
	t.Helper()
	base, err := stack.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return base
}
