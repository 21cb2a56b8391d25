// Package node_test runs student-bridge as it is deployed: the image `make
// image` builds, on a real node (kubelet, containerd, runc, the CNI bridge,
// kube-proxy, CoreDNS and the control plane, all started here), with the
// manifests and the chart as a user applies them. It needs root and cgroup
// v1 hierarchies it may write; without them every test skips with one line
// that says why.
package node_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/student-bridge/student-bridge/internal/stack"
)

// nd is the node every test of the package shares; nil when skipped.
var (
	nd         *node
	skipReason string
)

func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.Discard())
	bin := filepath.Join(stack.RepoRoot(), "bin")
	if skipReason = canRun(bin); skipReason != "" {
		fmt.Println("node tier skipped:", skipReason)
		os.Exit(m.Run())
	}
	var err error
	if nd, err = startNode(bin); err != nil {
		fmt.Fprintln(os.Stderr, "node:", err)
		os.Exit(1)
	}
	code := m.Run()
	if code != 0 {
		nd.printLogs(os.Stderr)
	}
	nd.teardown()
	os.Exit(code)
}

// needNode skips t where the node cannot run.
func needNode(t *testing.T) {
	t.Helper()
	if nd == nil {
		t.Skip("node tier skipped: " + skipReason)
	}
}
