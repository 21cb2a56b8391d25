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
func streamLeader(t *testing.T, s secrets) string {
	t.Helper()
	nc := connectNATS(t, natsURL(t, "consumer", s.consumer))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var leader string
	err = stacktest.Eventually(30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, "STUDENTS")
		if err != nil {
			return err
		}
		if c := st.CachedInfo().Cluster; c != nil && c.Leader != "" {
			leader = c.Leader
			return nil
		}
		return fmt.Errorf("stream STUDENTS has no leader")
	})
	if err != nil {
		t.Fatal(err)
	}
	return leader
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
			id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
			if _, err := run(filepath.Join(nd.bin, "ctr"), "--address", nd.containerdSock(), "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", id); err != nil {
				t.Fatal(err)
			}
			return func() time.Duration {
				return waitPods(t, "student-bridge", 3, func(pods []corev1.Pod) error {
					for _, q := range pods {
						if q.UID == p.UID && restarts(&q) > before {
							return nil
						}
					}
					return fmt.Errorf("pod %s has not restarted its container", p.Name)
				})
			}
		}},
		{"NATS stream leader deleted", func(t *testing.T) func() time.Duration {
			leader := streamLeader(t, s)
			var uid types.UID
			for _, p := range podsOf(t, "nats") {
				if p.Name == leader {
					uid = p.UID
				}
			}
			if uid == "" {
				t.Fatalf("stream leader %q is no NATS pod", leader)
			}
			kubectl(t, nil, "-n", systemNS, "delete", "pod", leader, "--wait=false")
			return func() time.Duration { return waitPods(t, "nats", 3, without(uid)) }
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
	}
}
