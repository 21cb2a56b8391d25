package stacktest

import (
	"testing"

	"github.com/student-bridge/student-bridge/internal/stack"
)

// PolicyMinor is the first Kubernetes minor version that serves
// admissionregistration.k8s.io/v1 MutatingAdmissionPolicy, the kind of the
// finalizer policy (deploy/admission).
const PolicyMinor = 36

// RequireFinalizerPolicy skips t, saying why, where the kube-apiserver the
// tests run against (KUBEBUILDER_ASSETS) is older than PolicyMinor: the
// compatibility tier (make test-compat) runs the same tests on every
// supported version and reports the skip as "not served" in its table. On
// 1.36 and later it returns, and a policy that does not install fails the
// test that asked for it.
func RequireFinalizerPolicy(t testing.TB) {
	t.Helper()
	minor, full, err := stack.APIServerVersion("")
	if err != nil {
		t.Fatal(err)
	}
	if minor < PolicyMinor {
		t.Skipf("not served: kube-apiserver %s serves no MutatingAdmissionPolicy (1.%d and later do); without it the bridge adds its finalizer itself", full, PolicyMinor)
	}
}

// PolicyServed reports whether the kube-apiserver the tests run against
// serves the finalizer policy's kind, by its version.
func PolicyServed(t testing.TB) bool {
	t.Helper()
	minor, _, err := stack.APIServerVersion("")
	if err != nil {
		t.Fatal(err)
	}
	return minor >= PolicyMinor
}
