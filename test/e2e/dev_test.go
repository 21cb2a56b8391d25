package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// TestDevStackSurvivesRestart drives `student-bridge dev` as a user would:
// kubectl against its kubeconfig, a NATS client against its port, Ctrl+C,
// and a second start that resumes with the same Students and stream.
func TestDevStackSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	natsPort := stacktest.FreePorts(t, 1)
	args := []string{"dev", "--dir", dir, "--nats-port", fmt.Sprint(natsPort), "--metrics-bind-address", "0", "--health-probe-bind-address", "0"}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)

	p := start(t, dir, args...)
	p.waitOutput(t, "local stack is up", 90*time.Second)
	p.waitOutput(t, "stream ready", 30*time.Second)
	if !strings.Contains(p.output(), "kubectl create -f configs/samples/student-instance.yaml") || !strings.Contains(p.output(), natsURL) {
		t.Errorf("banner lacks the commands to try:\n%s", p.output())
	}

	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	stacktest.Kubectl(t, kubeconfig, "create", "-f", "configs/samples/student-instance.yaml")
	got := waitEvents(t, nc, 1)
	if got[0].Event.Type() != studentv1.EventTypeCreated || got[0].Data.Spec.Name != "wang" {
		t.Fatalf("first event %s %+v", got[0].Event.Type(), got[0].Data)
	}
	if err := stacktest.Eventually(30*time.Second, func() error {
		out := stacktest.Kubectl(t, kubeconfig, "get", "stu", "object-name", "--no-headers")
		if !strings.Contains(out, "True") {
			return fmt.Errorf("not published yet: %s", out)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	if err := p.stop(t, syscall.SIGINT); err != nil {
		t.Fatalf("dev exited with %v after SIGINT\n%s", err, p.output())
	}
	if err := stacktest.Eventually(20*time.Second, func() error {
		if left := processesUsing(dir); len(left) > 0 {
			return fmt.Errorf("left behind: %v", left)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// Second start: same Student, same stream, nothing republished.
	p = start(t, dir, args...)
	p.waitOutput(t, "stream ready", 90*time.Second)
	out := stacktest.Kubectl(t, kubeconfig, "get", "stu", "object-name", "-o", "jsonpath={.spec.school}")
	if out != "china" {
		t.Fatalf("after restart the Student is %q", out)
	}
	stacktest.Kubectl(t, kubeconfig, "patch", "stu", "object-name", "--type=merge", "-p", `{"spec":{"school":"tsinghua"}}`)
	got = waitEvents(t, nc, 2)
	if got[1].Event.Type() != studentv1.EventTypeUpdated || got[1].Data.PreviousSpec == nil || got[1].Data.PreviousSpec.School != "china" {
		t.Errorf("after restart: %s %+v", got[1].Event.Type(), got[1].Data)
	}
	stacktest.Kubectl(t, kubeconfig, "delete", "stu", "object-name")
	got = waitEvents(t, nc, 3)
	if got[2].Event.Type() != studentv1.EventTypeDeleted {
		t.Errorf("delete: %s", got[2].Event.Type())
	}
	if err := p.stop(t, syscall.SIGTERM); err != nil {
		t.Fatalf("dev exited with %v after SIGTERM", err)
	}
}

func waitEvents(t *testing.T, nc *nats.Conn, want int) []stacktest.Received {
	t.Helper()
	var got []stacktest.Received
	if err := stacktest.Eventually(60*time.Second, func() error {
		var err error
		got, err = stacktest.StreamEvents(context.Background(), nc, "STUDENTS")
		if err != nil {
			return err
		}
		if len(got) != want {
			return fmt.Errorf("stream holds %d events, want %d", len(got), want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestDevNATSCluster: `student-bridge dev --nats-cluster 3` runs three NATS
// servers on the port given and the next two, in one JetStream cluster;
// the stream and the record store are at three replicas, and a Student
// created with kubectl is published.
func TestDevNATSCluster(t *testing.T) {
	dir := t.TempDir()
	// The cluster's servers listen on --nats-port and the next two.
	natsPort := stacktest.FreePorts(t, 3)
	p := start(t, dir, "dev", "--dir", dir, "--nats-port", fmt.Sprint(natsPort), "--nats-cluster", "3",
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0")
	p.waitOutput(t, "local stack is up", 90*time.Second)
	p.waitOutput(t, "stream ready", 30*time.Second)
	// Through the third server: the cluster serves JetStream from each.
	nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", natsPort+2))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	stacktest.Kubectl(t, filepath.Join(dir, "kubeconfig"), "create", "-f", "configs/samples/student-instance.yaml")
	if got := waitEvents(t, nc, 1); got[0].Event.Type() != studentv1.EventTypeCreated {
		t.Fatalf("first event %s", got[0].Event.Type())
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"STUDENTS", "KV_STUDENT_BRIDGE_PUBLISHED"} {
		s, err := js.Stream(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if info := s.CachedInfo(); info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			t.Errorf("%s: %d replicas configured, cluster %+v; want 3", name, info.Config.Replicas, info.Cluster)
		}
	}
	if err := p.stop(t, syscall.SIGINT); err != nil {
		t.Fatalf("dev exited with %v after SIGINT\n%s", err, p.output())
	}
}
