package node_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/internal/version"
)

// helm runs bin/helm against the node.
func helm(t *testing.T, args ...string) string {
	t.Helper()
	return userCommand(t, nil, filepath.Join(nd.bin, "helm"), args...)
}

// bridgeImages is the set of images the bridge's Ready pods run.
func bridgeImages(t *testing.T) map[string]int {
	images := map[string]int{}
	for _, p := range podsOf(t, "student-bridge") {
		if podReady(&p) {
			images[p.Spec.Containers[0].Image]++
		}
	}
	return images
}

// runJob creates a Job from the CronJob, as `kubectl create job --from`
// does for a run by hand, and returns whether it succeeded and its log.
func runJob(t *testing.T, cronJob, name string) (bool, string) {
	t.Helper()
	kubectl(t, nil, "-n", systemNS, "create", "job", name, "--from=cronjob/"+cronJob)
	var job batchv1.Job
	var done, ok bool
	err := stacktest.Eventually(3*time.Minute, func() error {
		if err := nd.c.Get(context.Background(), client.ObjectKey{Namespace: systemNS, Name: name}, &job); err != nil {
			return err
		}
		for _, c := range job.Status.Conditions {
			if c.Status == corev1.ConditionTrue && (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) {
				done, ok = true, c.Type == batchv1.JobComplete
			}
		}
		if !done {
			return fmt.Errorf("job %s has not ended: %d active, %d failed", name, job.Status.Active, job.Status.Failed)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, podSummary(systemNS))
	}
	out, _ := exec.Command(filepath.Join(nd.bin, "kubectl"), "--kubeconfig", nd.kubeconfig, "-n", systemNS, "logs", "job/"+name).CombinedOutput()
	return ok, string(out)
}

// TestHelmUpgradeUnderLoad: the chart with the NATS of deploy/nats, first
// at the previous release (its chart and image), upgraded to this one
// while Students change; verify finds nothing after. The verify CronJob's
// Job passes on the clean stream and fails on drift made on purpose.
// `helm uninstall` runs the release-finalizers Job, and no Student keeps
// the finalizer. It leaves the namespace empty for the overlay's tests.
func TestHelmUpgradeUnderLoad(t *testing.T) {
	needNode(t)
	t.Cleanup(func() {
		if t.Failed() {
			removeFailedRelease(t)
		}
	})
	if installed != nil {
		// A second round (-count=2): the overlay's tests ran in the same
		// namespace.
		uninstallDefault(t)
	}
	s := prepareNamespace(t)
	kubectl(t, nil, "apply", "-k", "deploy/nats")
	waitReady(t, natsSet(), 3*time.Minute)

	previous := filepath.Join(nd.bin, "previous/src/deploy/helm/student-bridge")
	helm(t, "install", "student-bridge", previous, "-n", systemNS, "--set", "image.tag=previous")
	took := waitPods(t, "student-bridge", 3, func([]corev1.Pod) error {
		if n := bridgeImages(t)["student-bridge:previous"]; n != 3 {
			return fmt.Errorf("%d Ready pods of the previous release", n)
		}
		return nil
	})
	t.Logf("the previous release Ready in %.1fs", took.Seconds())

	nc := connectNATS(t, natsURL(t, "consumer", s.consumer))
	l := startLoad(t, nc, loadRate, true)
	l.waitChanges(t, 5*loadRate) // the load under way
	helm(t, "upgrade", "student-bridge", "deploy/helm/student-bridge", "-n", systemNS,
		"--set", "verify.schedule=17 * * * *", "--set", "verify.settle=5s", "--set", "verify.natsAuth.secretName=student-bridge-nats")
	took = waitPods(t, "student-bridge", 3, func([]corev1.Pod) error {
		want := "student-bridge:" + version.Version
		if images := bridgeImages(t); images[want] != 3 || len(images) != 1 {
			return fmt.Errorf("Ready pods by image: %v, want 3 of %s", images, want)
		}
		return nil
	})
	l.finishClean(t, s, "helm upgrade from the previous release: all replicas at "+version.Version, took)

	// The verify CronJob: a run on the clean stream passes; one with a
	// Student no bridge published (the bridge scaled to zero) fails.
	if ok, out := runJob(t, "student-bridge-verify", "verify-clean"); !ok {
		t.Errorf("the verify Job failed on a clean stream:\n%s", out)
	}
	kubectl(t, nil, "-n", systemNS, "scale", "deployment/student-bridge", "--replicas=0")
	if err := stacktest.Eventually(2*time.Minute, func() error {
		if n := len(podsOf(t, "student-bridge")); n > 0 {
			return fmt.Errorf("%d bridge pods left", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	drift := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: l.ns, Name: "unpublished"}, Spec: studentv1.StudentSpec{Name: "x", School: "y"}}
	if err := nd.c.Create(context.Background(), drift); err != nil {
		t.Fatal(err)
	}
	if ok, out := runJob(t, "student-bridge-verify", "verify-drift"); ok || !strings.Contains(out, "unpublished") {
		t.Errorf("the verify Job with an unpublished Student: succeeded=%v, want a failure naming it:\n%s", ok, out)
	}
	kubectl(t, nil, "-n", systemNS, "scale", "deployment/student-bridge", "--replicas=3")
	waitPods(t, "student-bridge", 3, nil)

	// Uninstall: the post-delete Job releases every Student.
	helm(t, "uninstall", "student-bridge", "-n", systemNS, "--wait", "--timeout=3m")
	var students studentv1.StudentList
	if err := nd.c.List(context.Background(), &students); err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, st := range students.Items {
		for _, f := range st.Finalizers {
			if f == studentv1.Finalizer {
				held++
			}
		}
	}
	if held > 0 || len(students.Items) == 0 {
		t.Errorf("after helm uninstall %d of %d Students keep the finalizer", held, len(students.Items))
	}
	t.Logf("helm uninstall: the release-finalizers Job released %d Students", len(students.Items))
	removeNamespaceAndNATS(t)
}

// removeFailedRelease leaves the node as a passing TestHelmUpgradeUnderLoad
// does, for the overlay's tests after it: the release uninstalled if it
// can be, any Student still held released, the namespaces gone.
func removeFailedRelease(t *testing.T) {
	t.Helper()
	if out, err := exec.Command(filepath.Join(nd.bin, "helm"), "--kubeconfig", nd.kubeconfig, "uninstall", "student-bridge",
		"-n", systemNS, "--wait", "--timeout=3m").CombinedOutput(); err != nil {
		t.Logf("cleaning up: helm uninstall: %v\n%s", err, out)
	}
	ctx := context.Background()
	var students studentv1.StudentList
	if err := nd.c.List(ctx, &students); err != nil {
		t.Fatal(err)
	}
	for i := range students.Items {
		st := &students.Items[i]
		if held := slices.Index(st.Finalizers, studentv1.Finalizer); held >= 0 {
			st.Finalizers = slices.Delete(st.Finalizers, held, held+1)
			if err := nd.c.Update(ctx, st); client.IgnoreNotFound(err) != nil {
				t.Errorf("cleaning up: release %s/%s: %v", st.Namespace, st.Name, err)
			}
		}
	}
	removeNamespaceAndNATS(t)
}

// uninstallDefault removes deploy/default as docs/deploy.md says: the
// bridge's Deployment goes, `student-bridge release-finalizers` (run by
// hand with the bridge's shard count) frees the Students, then `make
// undeploy` removes the rest, the CRD with the Students included.
func uninstallDefault(t *testing.T) {
	t.Helper()
	kubectl(t, nil, "-n", systemNS, "delete", "deployment", "student-bridge", "--wait=true")
	cmd := exec.Command(filepath.Join(nd.bin, "image", "student-bridge"), "release-finalizers", "--shards", "16", "--wait", "2m", "--leader-election-namespace", systemNS)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+nd.kubeconfig)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("release-finalizers: %v\n%s", err, out)
	}
	makeTarget(t, "undeploy", "OVERLAY=default")
	removeNamespaceAndNATS(t)
	installed = nil
}

// removeNamespaceAndNATS deletes the bridge's namespace with NATS in it,
// NATS's volumes, and the namespaces the tests made Students in, and waits
// until they are gone.
func removeNamespaceAndNATS(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	studentNamespaces := testNamespaces
	testNamespaces = nil
	for _, ns := range append(studentNamespaces, systemNS) {
		if err := nd.c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
	}
	err := stacktest.Eventually(3*time.Minute, func() error {
		for _, ns := range append(studentNamespaces, systemNS) {
			err := nd.c.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{})
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("namespace %s not gone yet (%v)", ns, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var pvs corev1.PersistentVolumeList
	if err := nd.c.List(ctx, &pvs); err != nil {
		t.Fatal(err)
	}
	for _, pv := range pvs.Items {
		if err := nd.c.Delete(ctx, &pv); client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
	}
}
