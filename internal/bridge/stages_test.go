package bridge_test

import (
	"context"
	"fmt"
	"testing"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/internal/stages"
)

// TestStageLatencies: one Student created, edited and deleted through a
// bridge as deployed (finalizer, Kubernetes Events, status) is observed in
// every stage of student_bridge_stage_duration_seconds, as often as that
// life takes each stage.
func TestStageLatencies(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "stages")
	before, err := stages.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	startBridge(t, cfg)
	nc := natsConn(t)

	if err := st.Client.Create(ctx, newStudent(ns, "s", "wang", "china")); err != nil {
		t.Fatal(err)
	}
	waitStream(t, nc, cfg.NATS.Stream.Name, 1)
	stacktest.WaitFor(t, "the created event in the status", func() error {
		if c := publishedCondition(getStudent(t, ns, "s")); c == nil || c.Status != "True" {
			return fmt.Errorf("Published condition %+v", c)
		}
		return nil
	})
	patch(t, getStudent(t, ns, "s"), func(s *studentv1.Student) { s.Spec.School = "peking" })
	waitStream(t, nc, cfg.NATS.Stream.Name, 2)
	if err := st.Client.Delete(ctx, getStudent(t, ns, "s")); err != nil {
		t.Fatal(err)
	}
	waitStream(t, nc, cfg.NATS.Stream.Name, 3)

	// At least: a watch event per change (created, updated, deletion
	// started); one write-ahead record (the first event); three publishes
	// and their records; the finalizer added and removed; one status
	// write; a Kubernetes Event per publish.
	want := map[string]uint64{
		stages.Queue: 3, stages.WriteAhead: 1, stages.Publish: 3, stages.Record: 3,
		stages.Finalizer: 2, stages.Status: 1, stages.KubernetesEvent: 3,
	}
	stacktest.WaitFor(t, "every stage observed", func() error {
		after, err := stages.Snapshot()
		if err != nil {
			return err
		}
		got := stages.Since(before, after)
		for _, stage := range stages.All {
			if got[stage].Count < want[stage] {
				return fmt.Errorf("stage %s observed %d times, want at least %d", stage, got[stage].Count, want[stage])
			}
		}
		return nil
	})
}
