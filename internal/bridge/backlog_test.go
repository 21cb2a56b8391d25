package bridge_test

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/shards"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// TestShardBacklog: student_bridge_shard_unpublished shows, per shard the
// bridge holds, the changes it has seen and not published: while the stream
// takes no new events, the three Students changed and the one deleted
// meanwhile, each in its shard; once the stream takes them again, none.
func TestShardBacklog(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := shardedConfig(t, ns, "backlog")
	startBridge(t, cfg)
	nc := natsConn(t)

	const n = 8
	for i := range n {
		if err := st.Client.Create(ctx, newStudent(ns, fmt.Sprintf("s%d", i), "name", "school")); err != nil {
			t.Fatal(err)
		}
	}
	waitStream(t, nc, cfg.NATS.Stream.Name, n)
	none := map[string]float64{"0": 0, "1": 0, "2": 0, "3": 0}
	stacktest.WaitFor(t, "every shard held, nothing unpublished", func() error { return backlogIs(none) })

	// The stream is full and refuses new events.
	js, stream := openStream(t, nc, cfg.NATS.Stream.Name)
	open := stream.CachedInfo().Config
	full := open
	full.MaxMsgs, full.Discard = n, jetstream.DiscardNew
	if _, err := js.UpdateStream(ctx, full); err != nil {
		t.Fatal(err)
	}
	want := maps.Clone(none)
	for i := range 3 {
		name := fmt.Sprintf("s%d", i)
		patch(t, getStudent(t, ns, name), func(s *studentv1.Student) { s.Spec.School = "elsewhere" })
		want[strconv.Itoa(shards.Of(ns, name, cfg.Shards.Count))]++
	}
	if err := st.Client.Delete(ctx, getStudent(t, ns, "s7")); err != nil {
		t.Fatal(err)
	}
	want[strconv.Itoa(shards.Of(ns, "s7", cfg.Shards.Count))]++
	stacktest.WaitFor(t, "the three changes and the delete counted in their shards", func() error { return backlogIs(want) })

	if _, err := js.UpdateStream(ctx, open); err != nil {
		t.Fatal(err)
	}
	waitStream(t, nc, cfg.NATS.Stream.Name, n+4)
	stacktest.WaitFor(t, "nothing unpublished once the stream took them", func() error { return backlogIs(none) })
}

// backlogIs compares student_bridge_shard_unpublished, by shard, with want.
func backlogIs(want map[string]float64) error {
	families, err := metrics.Registry.(prometheus.Gatherer).Gather()
	if err != nil {
		return err
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "student_bridge_shard_unpublished" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "shard" {
					got[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	if !maps.Equal(got, want) {
		return fmt.Errorf("unpublished by shard %v, want %v", got, want)
	}
	return nil
}
