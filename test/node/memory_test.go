package node_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// manyStudents is how many Students the memory limit is shown to hold.
const manyStudents = 10000

// cgroupMemory reads a container's memory cgroup (v1) as the kubelet made
// it: the peak usage, and the RSS of its memory.stat.
func cgroupMemory(p *corev1.Pod, containerID string) (peak, rss uint64, err error) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/memory/kubepods*", "*", "pod"+string(p.UID), containerID))
	more, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/memory/kubepods*", "pod"+string(p.UID), containerID))
	dirs = append(dirs, more...)
	if len(dirs) != 1 {
		return 0, 0, fmt.Errorf("the memory cgroup of %s's container %s: found %v", p.Name, containerID, dirs)
	}
	b, err := os.ReadFile(filepath.Join(dirs[0], "memory.max_usage_in_bytes"))
	if err != nil {
		return 0, 0, err
	}
	if peak, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err != nil {
		return 0, 0, err
	}
	f, err := os.Open(filepath.Join(dirs[0], "memory.stat"))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " "); ok && k == "total_rss" {
			rss, err = strconv.ParseUint(v, 10, 64)
		}
	}
	return peak, rss, err
}

// TestMemoryLimitHolds10000Students: the bridge's replicas hold 10,000
// Students under the shipped memory limit (256Mi; the bridge reads it from
// its cgroup and sets its Go memory limit to 90% of it)
// without an OOM kill; the peak and RSS the kubelet's cgroups report are
// logged.
func TestMemoryLimitHolds10000Students(t *testing.T) {
	needNode(t)
	s := defaultInstalled(t)
	ctx := context.Background()
	nc := connectNATS(t, natsURL(t, "consumer", s.consumer))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	created := func() uint64 {
		st, err := js.Stream(ctx, "STUDENTS")
		if err != nil {
			return 0
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter("student.created"))
		if err != nil {
			return 0
		}
		return info.State.Subjects["student.created"]
	}
	before := created()
	restartsBefore := map[string]int32{}
	for _, p := range podsOf(t, "student-bridge") {
		restartsBefore[p.Name] = restarts(&p)
		// The bridge read its container's limit from its cgroup.
		limit := p.Spec.Containers[0].Resources.Limits.Memory().Value()
		want := fmt.Sprintf(`"containerLimit":%d,"goMemLimit":%d`, limit, limit/10*9)
		if logs := kubectl(t, nil, "-n", systemNS, "logs", p.Name, "-c", "student-bridge"); !strings.Contains(logs, "Go memory limit set") || !strings.Contains(logs, want) {
			t.Errorf("pod %s did not log %s:\n%s", p.Name, want, logs[:min(len(logs), 2000)])
		}
	}

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "many-"}}
	if err := nd.c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	testNamespaces = append(testNamespaces, ns.Name)
	c := unthrottledClient(t)
	start := time.Now()
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= manyStudents; i = next.Add(1) {
				st := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: fmt.Sprintf("s-%05d", i)},
					Spec: studentv1.StudentSpec{Name: fmt.Sprintf("student %d", i), School: "school"}}
				if err := c.Create(ctx, st); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d creates failed", n)
	}
	err = stacktest.Eventually(5*time.Minute, func() error {
		if got := created() - before; got < manyStudents {
			return fmt.Errorf("%d of %d created events in the stream", got, manyStudents)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d Students created and published in %.1fs", manyStudents, time.Since(start).Seconds())
	// Every Student published, the replicas drain their status writes on
	// status.qps, holding every Student: watch each write ten more.
	const statusWrites = `student_bridge_status_writes_total{result="success"}`
	drained := map[string]float64{}
	for _, p := range podsOf(t, "student-bridge") {
		if drained[p.Name], err = podCounter(&p, statusWrites); err != nil {
			t.Fatal(err)
		}
	}
	err = stacktest.Eventually(2*time.Minute, func() error {
		for _, p := range podsOf(t, "student-bridge") {
			v, err := podCounter(&p, statusWrites)
			if err != nil {
				return err
			}
			if v < drained[p.Name]+10 {
				return fmt.Errorf("pod %s wrote %v statuses since every Student was published, want 10", p.Name, v-drained[p.Name])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range podsOf(t, "student-bridge") {
		cs := p.Status.ContainerStatuses[0]
		if restarts(&p) != restartsBefore[p.Name] {
			t.Errorf("pod %s restarted while holding %d Students (last state %+v)", p.Name, manyStudents, cs.LastTerminationState.Terminated)
		}
		limit := p.Spec.Containers[0].Resources.Limits.Memory().Value()
		peak, rss, err := cgroupMemory(&p, strings.TrimPrefix(cs.ContainerID, "containerd://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("pod %s with %d Students: RSS %.1f MiB, peak usage %.1f MiB of the %.0f MiB limit", p.Name, manyStudents, float64(rss)/(1<<20), float64(peak)/(1<<20), float64(limit)/(1<<20))
		if int64(peak) >= limit {
			t.Errorf("pod %s reached its memory limit", p.Name)
		}
	}
}
