package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/student-bridge/student-bridge/internal/config"
)

// idleCost measures what the bridge writes to the API server when no
// Student changes, with the default Lease timing: one bridge with leader
// election, and three replicas over 16 shards (what the deployments run).
// Every replica runs in this process, each with its own connections.
func idleCost(ctx context.Context, e *env, window time.Duration) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "At rest (no Student changing, default Lease timing, writes counted over %s once the shards settled):\n\n", window)
	b.WriteString("| shape | API writes | per second |\n| --- | --- | --- |\n")
	for _, shape := range []struct {
		name             string
		replicas, shards int
	}{
		{"1 bridge, leader election", 1, 1},
		{"3 replicas, leader election", 3, 1},
		{"3 replicas over 16 shards", 3, 16},
	} {
		r := &run{id: fmt.Sprintf("idle%d-%d", shape.replicas, shape.shards), tr: newTracker()}
		r.ns, r.prefix, r.stream = "bench-"+r.id, "bench"+r.id, "BENCH"+strings.ToUpper(r.id)
		if err := newNamespace(ctx, e, r.ns, false); err != nil {
			return "", err
		}
		stopAll, err := startBridges(ctx, e, r, shape.replicas, func(cfg *config.Config) {
			cfg.LeaderElection.Enabled = true
			cfg.LeaderElection.ID = "bench-" + r.id
			cfg.LeaderElection.Namespace = r.ns
			cfg.Shards.Count = shape.shards
		})
		if err != nil {
			return "", err
		}
		if err := settled(ctx, e, r, shape.replicas, shape.shards, 60*time.Second); err != nil {
			stopAll()
			return "", err
		}
		time.Sleep(2 * time.Second) // the last acquisitions' writes are done
		before, t0 := r.studentWrites.Load()+r.eventWrites.Load()+r.otherWrites.Load(), time.Now()
		time.Sleep(window)
		writes := r.studentWrites.Load() + r.eventWrites.Load() + r.otherWrites.Load() - before
		elapsed := time.Since(t0)
		stopAll()
		_ = e.js.DeleteStream(ctx, r.stream)
		fmt.Fprintf(&b, "| %s | %d | %.2f |\n", shape.name, writes, float64(writes)/elapsed.Seconds())
	}
	return b.String(), nil
}
