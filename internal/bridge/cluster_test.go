package bridge_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stack"
)

// TestClusterStreamLeaderKilled: on a three-node JetStream cluster with the
// stream and buckets at three replicas (as deploy/nats runs them), the
// node that leads the stream is stopped while Students change, and started
// again on its store: every Student's last event carries its current state,
// every deleted one's last event is its deletion, and no event id is in
// the stream twice.
func TestClusterStreamLeaderKilled(t *testing.T) {
	ctx := context.Background()
	cluster, err := stack.StartNATSCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Stop)
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "cluster")
	cfg.NATS.URLs = cluster.URL()
	cfg.NATS.Stream.Replicas, cfg.State.Replicas = 3, 3
	cfg.NATS.AckTimeout = 300 * time.Millisecond // publishes during the election fail and are retried
	startBridge(t, cfg)
	nc, err := nats.Connect(cluster.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)

	for i := range 20 {
		if err := st.Client.Create(ctx, newStudent(ns, fmt.Sprintf("s%02d", i), "wang", "china")); err != nil {
			t.Fatal(err)
		}
	}
	waitStream(t, nc, cfg.NATS.Stream.Name, 20)

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, cfg.NATS.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	leader := s.CachedInfo().Cluster.Leader
	node := cluster.Server(leader)
	if node == nil {
		t.Fatalf("stream leader %q is not one of the cluster's servers", leader)
	}
	failed := publishErrors(t)
	// The node stops in the middle of 40 creates, so that publishes are
	// in flight; then, while the stream may still elect a new leader, 10
	// Students are updated and 5 deleted.
	for i := 20; i < 60; i++ {
		if i == 30 {
			node.Shutdown()
		}
		if err := st.Client.Create(ctx, newStudent(ns, fmt.Sprintf("s%02d", i), "wang", "china")); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		patch(t, getStudent(t, ns, fmt.Sprintf("s%02d", i)), func(s *studentv1.Student) { s.Spec.School = "peking" })
	}
	for i := 10; i < 15; i++ {
		if err := st.Client.Delete(ctx, getStudent(t, ns, fmt.Sprintf("s%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now()
	if err := node.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stream telling the truth about every Student", func() error { return streamAgrees(ctx, nc, cfg.NATS.Stream.Name, ns) })
	t.Logf("fault report: stream leader %s stopped while 55 Students changed, then restarted: everything published %s after the restart; publishes that failed and were retried meanwhile: %v",
		leader, time.Since(t0).Round(100*time.Millisecond), publishErrors(t)-failed)
}

// publishErrors is how many publishes failed in this test binary so far.
func publishErrors(t *testing.T) float64 {
	t.Helper()
	return counter(t, "student_bridge_events_published_total", map[string]string{"result": "error"})
}

// streamAgrees compares the stream with the API server: the last event of
// every Student of ns carries its current spec, the last event of every
// other name seen is deleted, and no id is there twice.
func streamAgrees(ctx context.Context, nc *nats.Conn, stream, ns string) error {
	evs, err := stack.StreamEvents(ctx, nc, stream)
	if err != nil {
		return err
	}
	last := map[string]stack.Received{}
	ids := map[string]int{}
	for _, ev := range evs {
		last[ev.Data.Metadata.Name] = ev
		ids[ev.Event.ID()]++
	}
	for id, n := range ids {
		if n > 1 {
			return fmt.Errorf("event %s is in the stream %d times", id, n)
		}
	}
	var list studentv1.StudentList
	if err := st.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return err
	}
	live := map[string]bool{}
	for _, s := range list.Items {
		live[s.Name] = true
		ev, ok := last[s.Name]
		if !ok || ev.Event.Type() == studentv1.EventTypeDeleted || ev.Data.Spec != s.Spec || string(s.UID) != ev.Data.Metadata.UID {
			return fmt.Errorf("%s (%s): last event %s %+v, want its current spec %+v", s.Name, s.UID, ev.Event.Type(), ev.Data.Spec, s.Spec)
		}
	}
	for name, ev := range last {
		if !live[name] && ev.Event.Type() != studentv1.EventTypeDeleted {
			return fmt.Errorf("%s is gone, but its last event is %s", name, ev.Event.Type())
		}
	}
	return nil
}
