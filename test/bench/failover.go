package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/shards"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// failoverPerShard is how many Students of each shard change right after a
// replica is killed.
const failoverPerShard = 10

// failoverAtScale runs three bridge processes over 16 shards, with the
// shipped Lease timing (15s / 10s / 2s), on the Students named in ns; once
// every one is published it reports each replica's memory, restarts two
// (so they hold every record, as replicas that ran a while do), SIGKILLs
// the third,
// changes some Students of every shard at once and reports how long the
// changes of the killed replica's shards waited for their events, and how
// much of it the survivors spent loading the shards they gained.
func failoverAtScale(ctx context.Context, e *env, ns string, names []string) (Failover, error) {
	out := Failover{Students: len(names), PerShard: failoverPerShard}
	bins, err := e.prepare()
	if err != nil {
		return out, err
	}
	const stream, prefix, id = "BENCHFO", "benchfo", "bench-failover"
	args := []string{"--kubeconfig", bins.config, "--nats-url", e.st.NATS.URL(), "--namespaces", ns,
		"--stream-name", stream, "--records-bucket", stream + "_RECORDS", "--receipts-bucket", stream + "_RECEIPTS",
		"--subject-prefix", prefix, "--snapshot-request-subject", "", "--kubernetes-events=false",
		"--shards", "16", "--leader-election-id", id, "--leader-election-namespace", ns}
	var replicas []*proc
	defer func() {
		for _, r := range replicas {
			r.kill()
		}
	}()
	start := func() (*proc, error) { return startProcess(bins, args) }
	before := streamMsgs(ctx, e, stream)
	for range 3 {
		r, err := start()
		if err != nil {
			return out, err
		}
		replicas = append(replicas, r)
	}
	t0 := time.Now()
	if err := waitStreamMsgs(ctx, e, stream, before+uint64(len(names)), 30*time.Minute); err != nil {
		return out, err
	}
	out.PublishedMs = toMS(time.Since(t0))
	time.Sleep(5 * time.Second)
	for _, r := range replicas {
		out.Replicas = append(out.Replicas, ReplicaAtRest{Memory: memoryOf(procStatus(r.cmd.Process.Pid, "VmRSS"), metric(r.metrics, "go_memstats_heap_inuse_bytes")/1e6),
			Shards: metric(r.metrics, "student_bridge_shards_held")})
	}

	// The survivors-to-be restart once, as a rolling update would: a
	// replica that has run a while holds every record at its revision, and
	// a shard it gains needs only what the others wrote since.
	for i := 1; i < len(replicas); i++ {
		replicas[i].stop()
		r, err := start()
		if err != nil {
			return out, err // the deferred kill finds the stopped one exited
		}
		replicas[i] = r
	}
	if err := settled(ctx, e, &run{ns: ns}, len(replicas), 16, 3*time.Minute); err != nil {
		return out, err
	}
	// ... and are done starting: records loaded, cache synced, nothing
	// queued by a catch-up.
	if err := stacktest.Eventually(5*time.Minute, func() error {
		for i, r := range replicas {
			if metric(r.metrics, "student_bridge_publishing_start_time_seconds") == 0 || metric(r.metrics, "student_bridge_catch_up_students") > 0 {
				return fmt.Errorf("failover: replica %d has not caught up after its restart", i+1)
			}
		}
		return nil
	}); err != nil {
		return out, err
	}
	time.Sleep(5 * time.Second)

	holdersBefore, err := shardHolders(ctx, e, ns, id)
	if err != nil {
		return out, err
	}
	survivors := replicas[1:]
	loadCount0, loadSum0 := 0.0, 0.0
	for _, r := range survivors {
		loadCount0 += metric(r.metrics, "student_bridge_shard_load_duration_seconds_count")
		loadSum0 += metric(r.metrics, "student_bridge_shard_load_duration_seconds_sum")
	}

	// Some Students of every shard change right after the kill; each
	// change's event is waited for.
	perShard := map[int][]string{}
	for _, name := range names {
		if n := shards.Of(ns, name, 16); len(perShard[n]) < failoverPerShard {
			perShard[n] = append(perShard[n], name)
		}
	}
	var mu sync.Mutex
	arrived := map[string]time.Time{}
	sub, err := e.nc.Subscribe(prefix+".>", func(msg *nats.Msg) {
		r, err := stacktest.Decode(msg)
		if err == nil && strings.HasPrefix(r.Data.Spec.School, "failover") {
			mu.Lock()
			arrived[r.Data.Metadata.Name] = time.Now()
			mu.Unlock()
		}
	})
	if err != nil {
		return out, err
	}
	defer func() { _ = sub.Unsubscribe() }()

	replicas[0].kill()
	replicas = replicas[1:]
	killed := time.Now()
	changed := 0
	for _, group := range perShard {
		for _, name := range group {
			s := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
			if err := e.st.Client.Patch(ctx, s, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"school":"failover"}}`))); err != nil {
				return out, err
			}
			changed++
		}
	}
	if err := stacktest.Eventually(3*time.Minute, func() error {
		mu.Lock()
		defer mu.Unlock()
		if n := len(arrived); n != changed {
			return fmt.Errorf("failover: %d of %d changes published within 3 minutes of the kill", n, changed)
		}
		return nil
	}); err != nil {
		return out, err
	}
	holdersAfter, err := shardHolders(ctx, e, ns, id)
	if err != nil {
		return out, err
	}
	var moved, stayed []time.Duration
	movedShards := 0
	for n, group := range perShard {
		gone := holdersBefore[n] != holdersAfter[n]
		if gone {
			movedShards++
		}
		for _, name := range group {
			if gone {
				moved = append(moved, arrived[name].Sub(killed))
			} else {
				stayed = append(stayed, arrived[name].Sub(killed))
			}
		}
	}
	if len(moved) == 0 {
		return out, fmt.Errorf("failover: no shard changed hands after the kill")
	}
	slices.Sort(moved)
	slices.Sort(stayed)
	loads, loadSum := -loadCount0, -loadSum0
	for _, r := range survivors {
		loads += metric(r.metrics, "student_bridge_shard_load_duration_seconds_count")
		loadSum += metric(r.metrics, "student_bridge_shard_load_duration_seconds_sum")
	}
	last := func(d []time.Duration) time.Duration {
		if len(d) == 0 {
			return 0
		}
		return d[len(d)-1]
	}
	out.MovedShards, out.MovedFirstMs, out.MovedLastMs, out.StayedLastMs = movedShards, toMS(moved[0]), toMS(last(moved)), toMS(last(stayed))
	out.Loads, out.LoadsMs = loads, loadSum*1000
	return out, nil
}

// shardHolders maps every shard of the bridge id to the replica holding it.
func shardHolders(ctx context.Context, e *env, ns, id string) (map[int]string, error) {
	var leases coordinationv1.LeaseList
	if err := e.st.Client.List(ctx, &leases, client.InNamespace(ns), client.MatchingLabels{shards.LabelBridge: id}); err != nil {
		return nil, err
	}
	return shards.ShardHolders(leases.Items, time.Now()), nil
}
