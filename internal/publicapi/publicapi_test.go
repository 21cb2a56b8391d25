package publicapi

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/internal/version"
)

const module = "github.com/student-bridge/student-bridge"

// run runs a command in dir and returns its standard output; a failure
// ends the test with what the command said.
func run(t *testing.T, dir, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s (in %s): %v\n%s", name, strings.Join(args, " "), dir, err, stderr.Bytes())
	}
	return out
}

// TestPublicPackagesStandAlone: a service that decodes and consumes events
// with the public packages (examples/roster is one) links neither
// controller-runtime nor client-go, and none of the bridge's own packages:
// what it builds is what the project promises to keep.
func TestPublicPackagesStandAlone(t *testing.T) {
	root := stack.RepoRoot()
	args := []string{"list", "-deps", "-f", "{{.ImportPath}}", "./examples/roster"}
	for _, p := range Packages {
		args = append(args, "./"+p)
	}
	deps := strings.Fields(string(run(t, root, "go", args...)))
	var linked []string
	for _, d := range deps {
		if rel, ok := strings.CutPrefix(d, module+"/"); ok && !slices.Contains(Packages, rel) && rel != "examples/roster" {
			t.Errorf("a public package imports %s, which is the bridge's implementation", d)
		}
		for _, heavy := range []string{"sigs.k8s.io/controller-runtime", "k8s.io/client-go", "github.com/prometheus/client_golang"} {
			if strings.HasPrefix(d, heavy+"/") {
				linked = append(linked, d)
			}
		}
	}
	if len(linked) > 0 {
		t.Errorf("a consumer's build links %d packages of the bridge's runtime, e.g. %s", len(linked), linked[0])
	}
	if !slices.Contains(deps, module+"/consumer") {
		t.Fatalf("go list named no consumer package: %v", deps)
	}
}

// release is the commit that set the version this tree is, or comes after
// (internal/version): the last release.
func release(t *testing.T, root string) string {
	t.Helper()
	out := run(t, root, "git", "log", "-1", "--format=%H", "-S", `Version = "`+version.Version+`"`, "--", "internal/version/version.go")
	commit := strings.TrimSpace(string(out))
	if commit == "" {
		t.Fatalf("no commit of internal/version/version.go sets %s (a clone with history is needed)", version.Version)
	}
	return commit
}

// TestPublicAPIKeepsTheLastRelease compares each public package with the
// same package at the last release, with apidiff: a removed or changed
// exported identifier fails, unless the module's path names a new major
// version (Go's import compatibility rule: github.com/.../v2).
func TestPublicAPIKeepsTheLastRelease(t *testing.T) {
	root := stack.RepoRoot()
	apidiff := filepath.Join(root, "bin", "apidiff")
	if _, err := os.Stat(apidiff); err != nil {
		t.Fatalf("%v: `make test` (or `make tools`) builds it", err)
	}
	commit := release(t, root)
	old := t.TempDir()
	stacktest.Archive(t, root, commit, old, append([]string{"go.mod"}, Packages...)...)
	released, err := os.ReadFile(filepath.Join(old, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	current, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if stack.ModulePath(released) != stack.ModulePath(current) {
		t.Skipf("the module is %s, the release was %s: a new major version may break its API", stack.ModulePath(current), stack.ModulePath(released))
	}
	// The release's packages are type-checked with this tree's module
	// versions, as hack/previous-release.sh builds it: the modules they
	// share are a patch or a minor version apart, and these are in the
	// module cache.
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(old, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	exports := t.TempDir()
	for _, p := range Packages {
		if _, err := os.Stat(filepath.Join(old, p)); err != nil {
			t.Logf("%s is new since %.12s", p, commit)
			continue
		}
		name := strings.ReplaceAll(p, "/", "-")
		then, now := filepath.Join(exports, name+".released"), filepath.Join(exports, name+".now")
		run(t, old, apidiff, "-w", then, module+"/"+p)
		run(t, root, apidiff, "-w", now, module+"/"+p)
		if breaks := strings.TrimSpace(string(run(t, root, apidiff, "-incompatible", then, now))); breaks != "" {
			t.Errorf("%s is not compatible with release %s (%.12s):\n%s", p, version.Version, commit, breaks)
		}
	}
	if t.Failed() {
		t.Log("a service built against the release breaks: keep the change additive (a new function, a new field, an option), or move the module to a new major version (its path's /vN) and say in CHANGELOG.md what a service must change")
	}
}
