package stacktest

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

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
