package node_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/internal/version"
)

const systemNS = "student-bridge-system"

// userCommand runs a command as a user at the repository root types it,
// with KUBECONFIG naming the node, and fails t unless it succeeds.
func userCommand(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = stack.RepoRoot()
	cmd.Env = append(os.Environ(), append([]string{"KUBECONFIG=" + nd.kubeconfig}, env...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out)
}

// kubectl runs bin/kubectl against the node.
func kubectl(t *testing.T, env []string, args ...string) string {
	t.Helper()
	return userCommand(t, env, filepath.Join(nd.bin, "kubectl"), args...)
}

// makeTarget runs a target of the Makefile against the node, as
// docs/deploy.md has a user run it.
func makeTarget(t *testing.T, args ...string) {
	t.Helper()
	userCommand(t, nil, "make", append([]string{"--no-print-directory"}, args...)...)
}

// secrets are the NATS passwords the Secret student-bridge-nats holds.
type secrets struct{ bridge, consumer, roster string }

func randomHex(t *testing.T) string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// installDefault applies deploy/default as docs/deploy.md says: the
// namespace under restricted Pod Security, the Secret, then `make deploy`
// with the image `make image` built. The NATS claims get local volumes:
// the node has no provisioner.
func installDefault(t *testing.T) secrets {
	t.Helper()
	s := prepareNamespace(t)
	makeTarget(t, "deploy", "OVERLAY=default", "IMG=student-bridge:"+version.Version)
	return s
}

// prepareNamespace makes what docs/deploy.md has a user make before
// either install: the namespace under restricted Pod Security and the
// Secret with the NATS passwords; and local volumes for NATS's claims.
func prepareNamespace(t *testing.T) secrets {
	t.Helper()
	s := secrets{randomHex(t), randomHex(t), randomHex(t)}
	kubectl(t, nil, "create", "namespace", systemNS)
	kubectl(t, nil, "label", "namespace", systemNS, "pod-security.kubernetes.io/enforce=restricted")
	kubectl(t, nil, "-n", systemNS, "create", "secret", "generic", "student-bridge-nats",
		"--from-literal=bridge-password="+s.bridge, "--from-literal=consumer-password="+s.consumer, "--from-literal=roster-password="+s.roster)
	makeLocalVolumes(t, 3)
	return s
}

// makeLocalVolumes makes k PersistentVolumes on the node's disk for the
// NATS StatefulSet's claims.
func makeLocalVolumes(t *testing.T, k int) {
	t.Helper()
	for i := range k {
		dir := filepath.Join(nd.dir, "volumes", fmt.Sprintf("pv-%d-%d", time.Now().UnixNano(), i))
		if err := os.MkdirAll(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		// The NATS pods run as user 1000; a hostPath volume is not given
		// to the pod's fsGroup.
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: filepath.Base(dir)},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
				PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
			},
		}
		if err := nd.c.Create(context.Background(), pv); err != nil {
			t.Fatal(err)
		}
	}
}

// waitReady waits until the StatefulSet or Deployment has all its replicas
// ready and updated, and returns how long that took.
func waitReady(t *testing.T, obj client.Object, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	err := stacktest.Eventually(timeout, func() error {
		if err := nd.c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		switch o := obj.(type) {
		case *appsv1.Deployment:
			want := *o.Spec.Replicas
			if o.Status.ObservedGeneration < o.Generation || o.Status.UpdatedReplicas != want || o.Status.ReadyReplicas != want || o.Status.Replicas != want {
				return fmt.Errorf("deployment %s: %d updated, %d ready, %d in all of %d", o.Name, o.Status.UpdatedReplicas, o.Status.ReadyReplicas, o.Status.Replicas, want)
			}
		case *appsv1.StatefulSet:
			want := *o.Spec.Replicas
			if o.Status.ObservedGeneration < o.Generation || o.Status.ReadyReplicas != want || o.Status.UpdatedReplicas != want {
				return fmt.Errorf("statefulset %s: %d ready, %d updated of %d", o.Name, o.Status.ReadyReplicas, o.Status.UpdatedReplicas, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, podSummary(systemNS))
	}
	return time.Since(start)
}

// podSummary lists the namespace's pods with their phase, restarts and
// last termination, for a failure message.
func podSummary(ns string) string {
	var pods corev1.PodList
	if err := nd.c.List(context.Background(), &pods, client.InNamespace(ns)); err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "%s %s", p.Name, p.Status.Phase)
		for _, cs := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, " [%s ready=%v restarts=%d", cs.Name, cs.Ready, cs.RestartCount)
			if w := cs.State.Waiting; w != nil {
				fmt.Fprintf(&b, " waiting %s: %s", w.Reason, w.Message)
			}
			if l := cs.LastTerminationState.Terminated; l != nil {
				fmt.Fprintf(&b, " last %s (%d): %s", l.Reason, l.ExitCode, l.Message)
				out, _ := exec.Command(filepath.Join(nd.bin, "kubectl"), "--kubeconfig", nd.kubeconfig, "-n", ns, "logs", p.Name, "-c", cs.Name, "--previous", "--tail=10").CombinedOutput()
				fmt.Fprintf(&b, "\n    its last lines: %s", strings.ReplaceAll(strings.TrimSpace(string(out)), "\n", "\n    "))
			}
			b.WriteString("]")
		}
		for _, c := range p.Status.Conditions {
			if c.Status != corev1.ConditionTrue && c.Message != "" {
				fmt.Fprintf(&b, " %s: %s", c.Type, c.Message)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// natsURL is the NATS Service's address as a client outside the cluster
// reaches it on this node: its ClusterIP, through kube-proxy's rules.
func natsURL(t *testing.T, user, password string) string {
	t.Helper()
	var svc corev1.Service
	if err := nd.c.Get(context.Background(), client.ObjectKey{Namespace: systemNS, Name: "nats"}, &svc); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("nats://%s:%s@%s:4222", user, password, svc.Spec.ClusterIP)
}

// connectNATS connects to the cluster's NATS through its Service; kube-proxy
// needs a moment to program a new Service's endpoints.
func connectNATS(t *testing.T, url string) *nats.Conn {
	t.Helper()
	var nc *nats.Conn
	err := stacktest.Eventually(30*time.Second, func() error {
		var err error
		nc, err = nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// natsSet is deploy/nats's StatefulSet.
func natsSet() client.Object {
	return &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: "nats"}}
}

// installed holds the passwords of deploy/default once a test installed
// it; the tests after it use the same installation.
var installed *secrets

// defaultInstalled installs deploy/default unless a test did, and waits
// until NATS and the bridge are Ready.
func defaultInstalled(t *testing.T) secrets {
	t.Helper()
	if installed != nil {
		return *installed
	}
	s := installDefault(t)
	natsTook := waitReady(t, natsSet(), 3*time.Minute)
	bridgeTook := waitReady(t, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: "student-bridge"}}, 3*time.Minute)
	t.Logf("deploy/default: the NATS StatefulSet Ready in %.1fs, the bridge's Deployment %.1fs after", natsTook.Seconds(), bridgeTook.Seconds())
	installed = &s
	return s
}

// TestDefaultOverlay: deploy/default applied as a user applies it comes up
// on a real node (three NATS pods clustered by their DNS names, three
// bridge replicas Ready with the shipped probes under restricted Pod
// Security), and the tutorial's story reaches a subscriber through the NATS
// Service.
func TestDefaultOverlay(t *testing.T) {
	needNode(t)
	s := defaultInstalled(t)

	nc := connectNATS(t, natsURL(t, "consumer", s.consumer))
	sub, err := stacktest.Subscribe(nc, "student.*")
	if err != nil {
		t.Fatal(err)
	}
	waitEvent := func(typ, school string) stacktest.Received {
		t.Helper()
		var got stacktest.Received
		err := stacktest.Eventually(60*time.Second, func() error {
			evs, err := sub.Events()
			if err != nil {
				return err
			}
			for _, e := range evs {
				if e.Event.Type() == typ && e.Data.Metadata.Name == "object-name" && e.Data.Spec.School == school {
					got = e
					return nil
				}
			}
			return fmt.Errorf("no %s with school %s among %d events", typ, school, len(evs))
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}

	// The tutorial's story, through kubectl.
	editor := filepath.Join(t.TempDir(), "editor.sh")
	if err := os.WriteFile(editor, []byte("#!/bin/sh\nsed -i 's/school: china/school: tsinghua/' \"$1\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	kubectl(t, nil, "create", "-f", "configs/samples/student-instance.yaml")
	waitEvent(studentv1.EventTypeCreated, "china")
	if out := kubectl(t, nil, "get", "stu"); !strings.Contains(out, "object-name") || !strings.Contains(out, "china") {
		t.Errorf("kubectl get stu:\n%s", out)
	}
	kubectl(t, []string{"KUBE_EDITOR=" + editor}, "edit", "stu", "object-name")
	waitEvent(studentv1.EventTypeUpdated, "tsinghua")
	kubectl(t, nil, "label", "stu", "object-name", "year=2026")
	err = stacktest.Eventually(60*time.Second, func() error {
		evs, _ := sub.Events()
		for _, e := range evs {
			if e.Event.Type() == studentv1.EventTypeUpdated && e.Data.Metadata.Labels["year"] == "2026" {
				return nil
			}
		}
		return fmt.Errorf("no updated event with the label among %d", len(evs))
	})
	if err != nil {
		t.Fatal(err)
	}
	kubectl(t, nil, "delete", "stu", "object-name", "--timeout=60s")
	waitEvent(studentv1.EventTypeDeleted, "tsinghua")
	checkProbes(t)
	checkBuildInfo(t)
	var st studentv1.StudentList
	if err := nd.c.List(context.Background(), &st, client.InNamespace("default")); err != nil || len(st.Items) != 0 {
		t.Errorf("Students left after the delete: %d (%v)", len(st.Items), err)
	}
}

// probeResults reads the kubelet's probe counters for a container:
// results[probeType][result] summed over its pods.
func probeResults(container string) (map[string]map[string]float64, error) {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		// The kubelet serves a certificate it made itself.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the test node's own kubelet
	}}
	resp, err := hc.Get("https://" + nodeIP + ":10250/metrics/probes")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]float64{}
	for _, m := range families["prober_probe_total"].GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		if l["container"] != container || l["namespace"] != systemNS {
			continue
		}
		if out[l["probe_type"]] == nil {
			out[l["probe_type"]] = map[string]float64{}
		}
		out[l["probe_type"]][l["result"]] += m.GetCounter().GetValue()
	}
	return out, nil
}

// checkProbes waits until the kubelet has run the shipped liveness and
// readiness probes of every bridge pod with success, and fails t if a
// liveness probe failed: one on a wrong port or path fails here before it
// restarts a container. (Readiness fails while a replica starts, by
// design.)
func checkProbes(t *testing.T) {
	t.Helper()
	err := stacktest.Eventually(90*time.Second, func() error {
		r, err := probeResults("student-bridge")
		if err != nil {
			return err
		}
		if r["Liveness"]["failed"] > 0 || r["Liveness"]["unknown"] > 0 {
			return fmt.Errorf("liveness probes of the bridge failed: %v", r["Liveness"])
		}
		for _, typ := range []string{"Liveness", "Readiness"} {
			if r[typ]["successful"] < 3 {
				return fmt.Errorf("%s probes of the bridge: %v, want a success for each of 3 pods", typ, r[typ])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// checkBuildInfo reads each bridge pod's metrics port, as a Prometheus
// on the pod network would, for the release it runs.
func checkBuildInfo(t *testing.T) {
	t.Helper()
	want := fmt.Sprintf(`student_bridge_build_info{commit=%q,goversion=%q,version=%q} 1`, imageCommit(t), runtime.Version(), version.Version)
	for _, p := range podsOf(t, "student-bridge") {
		if b, err := podMetrics(&p); err != nil {
			t.Fatal(err)
		} else if !strings.Contains(b, want) {
			t.Errorf("pod %s's metrics lack %s", p.Name, want)
		}
	}
}

// podMetrics reads a bridge pod's metrics port.
func podMetrics(p *corev1.Pod) (string, error) {
	resp, err := http.Get("http://" + p.Status.PodIP + ":8080/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// podCounter is the value of one series (name{labels} as exposed) of a
// bridge pod's metrics.
func podCounter(p *corev1.Pod, series string) (float64, error) {
	b, err := podMetrics(p)
	if err != nil {
		return 0, err
	}
	if v, ok := seriesValue(b, series); ok {
		return v, nil
	}
	return 0, fmt.Errorf("pod %s exports no %s", p.Name, series)
}

// imageCommit is the commit the image's label names, the one make put in
// the binary.
func imageCommit(t *testing.T) string {
	t.Helper()
	_, cfg, _, _ := imageArchive(t, filepath.Join(nd.bin, "images/student-bridge.tar"))
	return cfg.Config.Labels["org.opencontainers.image.revision"]
}
