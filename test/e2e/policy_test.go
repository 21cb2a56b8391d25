package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// With the finalizer policy of deploy/admission the API server adds the
// finalizer as a Student is created. Students created and deleted while no
// bridge runs are then held until their deleted event is out (none is
// unobserved), and the bridge writes no finalizer of its own: its only
// writes to Students themselves are the finalizer removals after deletes.
func TestFinalizerPolicy(t *testing.T) {
	stacktest.RequireFinalizerPolicy(t)
	w := newWorldWith(t, stack.Options{FinalizerPolicy: true})
	for i := range 10 {
		s := w.create(t, "default", fmt.Sprintf("early-%d", i), "s0")
		if !controllerutil.ContainsFinalizer(s, studentv1.Finalizer) {
			t.Fatalf("created Student has finalizers %v, want the policy's %s", s.Finalizers, studentv1.Finalizer)
		}
	}
	for i := range 4 {
		w.delete(t, "default", fmt.Sprintf("early-%d", i))
	}
	w.update(t, "default", "early-8", "s1")
	w.requireHeld(t, "default", "early-0", "before any bridge ran")

	patches := studentPatches(t, w)
	start(t, t.TempDir(), w.bridgeArgs(w.admin)...)
	r := w.waitVerified(t, "default", 60*time.Second)
	if r.Unobserved != 0 {
		t.Errorf("%d Students deleted before the bridge saw them have no events; the policy's finalizer should have held them", r.Unobserved)
	}
	for i := range 5 {
		w.create(t, "default", fmt.Sprintf("late-%d", i), "s0")
	}
	r = w.waitVerified(t, "default", 60*time.Second)
	if got := studentPatches(t, w) - patches; got != 4 {
		t.Errorf("the bridge patched Students (not their status) %d times; want 4, the finalizer removals of the 4 deletes, and no finalizer additions", got)
	}
	t.Logf("fault report: Students created and deleted before the bridge ran, with the finalizer policy: %s", r)
}

// studentPatches is how many PATCH requests to Students (not to a
// subresource) the API server answered with 200, from its own metrics.
func studentPatches(t *testing.T, w *world) int {
	t.Helper()
	cs, err := kubernetes.NewForConfig(w.st.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		match := true
		for _, l := range []string{`code="200"`, `resource="students"`, `subresource=""`, `verb="PATCH"`} {
			match = match && strings.Contains(line, l)
		}
		if match {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			n += int(v)
		}
	}
	return n
}
