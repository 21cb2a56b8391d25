package node_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// loadRate is the changes a second the load aims at; the faults are
// promised under 50 a second, and the load's measured rate is checked
// against that (updates of a Student deleted meanwhile are not counted).
const loadRate = 75

// A change waits at most for a lost holder's shard Lease to expire
// (leaderElection.leaseDuration, 15 s in deploy/default) and a new holder
// to take it (leaderElection.retryPeriod, 2 s) and publish, with room for a
// loaded machine. None of the faults stops a holder for longer than its
// Lease.
const (
	leaseDuration = 15 * time.Second
	maxWait       = leaseDuration + 2*time.Second + 5*time.Second
)

// recordStream is the stream of the bridge's record store.
const recordStream = "KV_STUDENT_BRIDGE_PUBLISHED"

// nodeReadySince is nil once the node reports Ready with a heartbeat after
// t.
func nodeReadySince(t time.Time) error {
	var n corev1.Node
	if err := nd.c.Get(context.Background(), client.ObjectKey{Name: nodeName}, &n); err != nil {
		return err
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && c.LastHeartbeatTime.After(t) {
			return nil
		}
	}
	return fmt.Errorf("node %s not Ready since %s", nodeName, t.Format(time.TimeOnly))
}

// podsOf lists the pods with label app.kubernetes.io/name=app in the
// bridge's namespace.
func podsOf(t *testing.T, app string) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := nd.c.List(context.Background(), &pods, client.InNamespace(systemNS), client.MatchingLabels{"app.kubernetes.io/name": app}); err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, cs := range p.Status.ContainerStatuses {
		n += cs.RestartCount
	}
	return n
}

// waitPods waits until want pods of app are Ready and ok holds for them
// (e.g. none is a pod deleted by the fault), and returns how long it took.
func waitPods(t *testing.T, app string, want int, ok func([]corev1.Pod) error) time.Duration {
	t.Helper()
	start := time.Now()
	err := stacktest.Eventually(4*time.Minute, func() error {
		var ready []corev1.Pod
		for _, p := range podsOf(t, app) {
			if podReady(&p) {
				ready = append(ready, p)
			}
		}
		if len(ready) != want {
			return fmt.Errorf("%d of %d %s pods Ready", len(ready), want, app)
		}
		if ok != nil {
			return ok(ready)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, podSummary(systemNS))
	}
	return time.Since(start)
}

// waitGone watches the pod until it is removed, and returns when its
// container ended and with which exit code, as the kubelet reported them
// (-1 where the removal came before a report: then the time is the
// removal's).
func waitGone(t *testing.T, p *corev1.Pod) (time.Time, int32) {
	t.Helper()
	wc, err := client.NewWithWatch(nd.cfg, client.Options{Scheme: nd.c.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w, err := wc.Watch(ctx, &corev1.PodList{}, client.InNamespace(p.Namespace), client.MatchingFields{"metadata.name": p.Name})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var code int32 = -1
	var at time.Time
	for ev := range w.ResultChan() {
		q, ok := ev.Object.(*corev1.Pod)
		if !ok || q.UID != p.UID {
			continue
		}
		for _, cs := range q.Status.ContainerStatuses {
			if term := cs.State.Terminated; term != nil {
				code, at = term.ExitCode, term.FinishedAt.Time
			}
		}
		if ev.Type == watch.Deleted {
			if at.IsZero() {
				at = time.Now()
			}
			return at, code
		}
	}
	t.Fatalf("pod %s was not removed: %v", p.Name, ctx.Err())
	return at, code
}

// without is a check for waitPods: no Ready pod is one of uids.
func without(uids ...types.UID) func([]corev1.Pod) error {
	return func(pods []corev1.Pod) error {
		for _, p := range pods {
			for _, u := range uids {
				if p.UID == u {
					return fmt.Errorf("pod %s is still the one of before", p.Name)
				}
			}
		}
		return nil
	}
}

// streamLeader is the NATS server (its pod's name) leading the stream.
func streamLeader(t *testing.T, s secrets, stream string) string {
	t.Helper()
	js, done := consumerJS(t, natsURL(t, "consumer", s.consumer))
	defer done()
	var leader string
	err := stacktest.Eventually(30*time.Second, func() (err error) {
		leader, err = leaderOf(js, stream)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return leader
}

// consumerJS is JetStream at url (as the consumer user) and the close of
// its connection: a fault's connection is closed once the fault is made,
// not with the test (a soak makes dozens of faults).
func consumerJS(t *testing.T, url string) (jetstream.JetStream, func()) {
	t.Helper()
	nc := connectNATS(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js, nc.Close
}

// leaderOf is the server that leads stream now.
func leaderOf(js jetstream.JetStream, stream string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return "", err
	}
	if c := st.CachedInfo().Cluster; c != nil && c.Leader != "" {
		return c.Leader, nil
	}
	return "", fmt.Errorf("stream %s has no leader", stream)
}

// natsPod is the NATS pod named name (a server's name is its pod's).
func natsPod(t *testing.T, name string) corev1.Pod {
	t.Helper()
	for _, p := range podsOf(t, "nats") {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("%q is no NATS pod", name)
	return corev1.Pod{}
}

// ctr runs containerd's ctr on the node's containerd, on the container of
// pod p (its first), e.g. ctr(t, &p, "tasks", "kill", "-s", "SIGKILL").
func ctr(t *testing.T, p *corev1.Pod, args ...string) {
	t.Helper()
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	args = append(append([]string{"--address", nd.containerdSock(), "-n", "k8s.io"}, args...), id)
	if out, err := run(filepath.Join(nd.bin, "ctr"), args...); err != nil {
		t.Fatalf("ctr %v: %v\n%s", args, err, out)
	}
}

// restarted is a check for waitPods: pod p's container has restarted
// since it had before restarts.
func restarted(p *corev1.Pod, before int32) func([]corev1.Pod) error {
	return func(pods []corev1.Pod) error {
		for _, q := range pods {
			if q.UID == p.UID && restarts(&q) > before {
				return nil
			}
		}
		return fmt.Errorf("pod %s has not restarted its container", p.Name)
	}
}

// TestFaultsUnderLoad: each fault made while 60 changes a second come from
// outside the cluster loses nothing: every change reaches a subscriber and
// `student-bridge verify` finds no drift after it. The longest wait of a
// change is logged; it is bounded by the shard Lease's duration (15 s) and
// the retry, except where a fault stops the holder for longer.
func TestFaultsUnderLoad(t *testing.T) {
	needNode(t)
	s := defaultInstalled(t)
	nc := connectNATS(t, natsURL(t, "consumer", s.consumer))
	for _, f := range nodeFaults(s) {
		t.Run(f.name, func(t *testing.T) {
			l := startLoad(t, nc, loadRate, false)
			l.waitChanges(t, 3*loadRate) // the load under way
			wait := f.do(t)
			ready := wait()
			l.finishClean(t, s, f.name+": Ready again", ready)
		})
	}
}

// fault is one fault of the deployment on the node.
type fault struct {
	name string
	// do makes the fault and returns the wait for recovery.
	do func(t *testing.T) func() time.Duration
}

// nodeFaults are the faults of the deployment with secrets s the node
// tier makes under load, and the soak on a schedule.
func nodeFaults(s secrets) []fault {
	bridge := func(t *testing.T) []corev1.Pod { return podsOf(t, "student-bridge") }
	return []fault{
		{"rollout restart", func(t *testing.T) func() time.Duration {
			var uids []types.UID
			for _, p := range bridge(t) {
				uids = append(uids, p.UID)
			}
			kubectl(t, nil, "-n", systemNS, "rollout", "restart", "deployment/student-bridge")
			return func() time.Duration { return waitPods(t, "student-bridge", 3, without(uids...)) }
		}},
		{"pod deleted", func(t *testing.T) func() time.Duration {
			p := bridge(t)[0]
			deleted := time.Now()
			kubectl(t, nil, "-n", systemNS, "delete", "pod", p.Name, "--wait=false")
			return func() time.Duration {
				exited, code := waitGone(t, &p)
				grace := time.Duration(*p.Spec.TerminationGracePeriodSeconds) * time.Second
				t.Logf("the deleted pod exited %.1fs after SIGTERM (exit code %d; grace period %s)", exited.Sub(deleted).Seconds(), code, grace)
				// A bridge that ignores SIGTERM is killed at the end of
				// its grace period; one that handles it hands its shards
				// over and exits 0 well before.
				if exited.Sub(deleted) > grace-5*time.Second || code > 0 {
					t.Errorf("the bridge did not exit on SIGTERM: it ended %.1fs after the delete with exit code %d (grace period %s)", exited.Sub(deleted).Seconds(), code, grace)
				}
				return waitPods(t, "student-bridge", 3, without(p.UID))
			}
		}},
		{"container killed by the runtime", func(t *testing.T) func() time.Duration {
			p := bridge(t)[0]
			before := restarts(&p)
			ctr(t, &p, "tasks", "kill", "-s", "SIGKILL")
			return func() time.Duration { return waitPods(t, "student-bridge", 3, restarted(&p, before)) }
		}},
		{"NATS stream leader deleted", func(t *testing.T) func() time.Duration {
			p := natsPod(t, streamLeader(t, s, "STUDENTS"))
			kubectl(t, nil, "-n", systemNS, "delete", "pod", p.Name, "--wait=false")
			return func() time.Duration { return waitPods(t, "nats", 3, without(p.UID)) }
		}},
		{"kubelet restarted", func(t *testing.T) func() time.Duration {
			restarted := time.Now()
			if err := nd.restart("kubelet"); err != nil {
				t.Fatal(err)
			}
			return func() time.Duration {
				// Back once the new kubelet has reported the node Ready
				// and the pods Ready.
				return waitPods(t, "student-bridge", 3, func([]corev1.Pod) error { return nodeReadySince(restarted) })
			}
		}},
		{"API server's connections from pods reset", func(t *testing.T) func() time.Duration {
			// Every watch of the bridge (and its Lease renewals) cut at
			// the API server's end, as a restart or a load balancer
			// would: the informers must list and watch again.
			// The node's own clients (kubelet, this test) come from
			// nodeIP, inside podCIDR, and are left alone.
			port := nd.env.ControlPlane.APIServer.SecureServing.ListenAddr.Port
			out, err := run("ss", "-K", "-tnH", "state", "established",
				fmt.Sprintf("( sport = :%s and dst %s and not dst %s )", port, podCIDR, nodeIP))
			if err != nil {
				t.Fatalf("ss: %v\n%s", err, out)
			}
			reset := len(strings.Split(strings.TrimSpace(out), "\n"))
			if strings.TrimSpace(out) == "" {
				reset = 0
			}
			if reset < 3 {
				t.Fatalf("%d connections from pods to the API server reset, want one a bridge pod at least:\n%s", reset, out)
			}
			t.Logf("reset %d connections from pods to the API server", reset)
			return func() time.Duration { return waitPods(t, "student-bridge", 3, nil) }
		}},
	}
}

// storeFaults are the faults of the record store's NATS server that only
// the soak makes. Each loses nothing, but a change can wait far past the
// node tier's bound (maxWait) after them: the bridge's retries of the
// writes that failed meanwhile back off exponentially (retry.baseDelay
// doubling to retry.maxDelay), so a store gone for a few seconds delays a
// Student's retry by several times that.
func storeFaults(s secrets) []fault {
	return []fault{
		{"record store's leader killed", func(t *testing.T) func() time.Duration {
			// A crash, not a stop: the server gets no lame-duck time, and
			// comes back in the same pod with its volume.
			p := natsPod(t, streamLeader(t, s, recordStream))
			before := restarts(&p)
			ctr(t, &p, "tasks", "kill", "-s", "SIGKILL")
			return func() time.Duration { return waitPods(t, "nats", 3, restarted(&p, before)) }
		}},
		{"record store's leader paused until it steps down", func(t *testing.T) func() time.Duration {
			// The leader frozen (its cgroup) until the other two elect
			// another, then thawed: it finds a newer term and steps down.
			// The NATS users of deploy/nats may not ask for a step-down,
			// and the manifests as shipped are what is tested.
			leader := streamLeader(t, s, recordStream)
			p := natsPod(t, leader)
			// Asked through another server: through the Service the
			// question could go to the frozen one.
			var other string
			for _, q := range podsOf(t, "nats") {
				if q.Name != leader && podReady(&q) {
					other = q.Status.PodIP
				}
			}
			js, done := consumerJS(t, fmt.Sprintf("nats://consumer:%s@%s:4222", s.consumer, other))
			defer done()
			ctr(t, &p, "tasks", "pause")
			err := stacktest.Eventually(time.Minute, func() error {
				l, err := leaderOf(js, recordStream)
				if err == nil && l == leader {
					err = fmt.Errorf("%s still leads %s", l, recordStream)
				}
				return err
			})
			ctr(t, &p, "tasks", "resume")
			if err != nil {
				t.Fatal(err)
			}
			return func() time.Duration { return waitPods(t, "nats", 3, nil) }
		}},
	}
}
