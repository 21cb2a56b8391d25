package stacktest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/student-bridge/student-bridge/internal/stack"
)

// Kubectl runs the kubectl of the test assets (bin/) with kubeconfig, from
// the repository's root (so paths in args are the docs' paths), and
// returns its output; a failure fails t with what kubectl said.
func Kubectl(t testing.TB, kubeconfig string, args ...string) string {
	t.Helper()
	assets, err := stack.AssetsDir("")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(assets, "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Dir = stack.RepoRoot()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// AdminKubeconfig writes a kubeconfig of an admin (system:masters) of
// env's API server into a temporary directory of t, and returns its path.
func AdminKubeconfig(t testing.TB, env *envtest.Environment) string {
	t.Helper()
	user, err := env.AddUser(envtest.User{Name: "test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
