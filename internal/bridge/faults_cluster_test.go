package bridge_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/internal/verify"
	"github.com/student-bridge/student-bridge/sink"
)

// clusterFault is one fault of TestClusterFaults: inject strikes, reacted
// says whether the cluster (or the bridge) has reacted to it yet, heal
// undoes it.
type clusterFault struct {
	name string
	// leadsConnected: the stream and the record bucket are led by the
	// server the bridge is connected to (else by another one).
	leadsConnected bool
	// beforeHeal: everything is published before the fault heals.
	beforeHeal bool
	// unheld: deletes are not held by the finalizer.
	unheld  bool
	inject  func(t *testing.T, f *faulted) (heal func())
	reacted func(f *faulted) error
}

// faulted is the cluster a fault strikes and who led and was connected.
type faulted struct {
	c                 *stack.NATSCluster
	stream, bridge    string // the stream's and the bridge connection's names
	leader, connected string
}

// led says whether a server other than the one that led the stream when
// the fault struck leads it now.
func (f *faulted) led() error {
	for _, s := range f.c.Servers {
		if s.Server != nil && s.Server.Running() && s.Server.Name() != f.leader && s.Server.JetStreamIsStreamLeader("$G", f.stream) {
			return nil
		}
	}
	return fmt.Errorf("no new leader of %s yet", f.stream)
}

var clusterFaults = []clusterFault{
	{
		name:    "stream leader killed",
		inject:  func(t *testing.T, f *faulted) func() { return kill(t, f.c, f.leader) },
		reacted: (*faulted).led,
	},
	{
		name:    "stream leader killed, deletes not held by the finalizer",
		unheld:  true,
		inject:  func(t *testing.T, f *faulted) func() { return kill(t, f.c, f.leader) },
		reacted: (*faulted).led,
	},
	{
		name:    "connected node killed",
		inject:  func(t *testing.T, f *faulted) func() { return kill(t, f.c, f.connected) },
		reacted: moved,
	},
	{
		name:           "connected node, the stream's leader, cut off from the others",
		leadsConnected: true,
		inject: func(t *testing.T, f *faulted) func() {
			links := f.c.Links(f.connected)
			for _, l := range links {
				l.Cut()
			}
			return func() {
				for _, l := range links {
					l.Heal()
				}
			}
		},
		// The majority elects a leader of its own; the bridge, whose
		// publishes fail on the cut-off server, moves to one of the
		// majority's and publishes everything before the partition heals.
		beforeHeal: true,
		reacted: func(f *faulted) error {
			if err := f.led(); err != nil {
				return err
			}
			return moved(f)
		},
	},
	{
		name: "whole cluster stopped",
		inject: func(t *testing.T, f *faulted) func() {
			var heals []func()
			for _, s := range f.c.Servers {
				heals = append(heals, kill(t, f.c, s.Server.Name()))
			}
			return func() {
				for _, heal := range heals {
					heal()
				}
			}
		},
		reacted: func(*faulted) error { return nil },
	},
}

// moved says whether the bridge is connected to another server than the one
// it was connected to when the fault struck.
func moved(f *faulted) error {
	if now := connectedTo(f.c, f.bridge); now == "" || now == f.connected {
		return fmt.Errorf("the bridge is not connected to another server yet")
	}
	return nil
}

// kill stops the server named name as a crash would (NATSCluster.Kill)
// and returns its restart.
func kill(t *testing.T, c *stack.NATSCluster, name string) func() {
	t.Helper()
	restart, err := c.Kill(name)
	if err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := restart(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestClusterFaults: on a three-node JetStream cluster with the stream and
// buckets at three replicas (as deploy/nats runs them, acknowledging only
// what is on disk), each fault of clusterFaults strikes in the middle of 40
// creates; 10 Students are updated and 5 deleted before it heals. Then
// every Student's last event carries its current state, every deleted
// one's last event is its deletion, no event id is in the stream twice and
// each Student's events are in order. Servers stop with Shutdown: their
// stores keep what they acknowledged, as a killed server's synced store
// does.
func TestClusterFaults(t *testing.T) {
	for _, f := range clusterFaults {
		t.Run(f.name, func(t *testing.T) { testClusterFault(t, f) })
	}
}

func testClusterFault(t *testing.T, f clusterFault) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "cluster")
	cluster, nc := onCluster(t, cfg)
	cfg.NATS.Name = "bridge-" + ns
	cfg.Deletes.HoldWithFinalizer = !f.unheld
	cfg.NATS.AckTimeout = 300 * time.Millisecond // publishes during an election fail and are retried
	startBridge(t, cfg)

	createStudents(t, ns, "s%02d", 20)
	waitStream(t, nc, cfg.NATS.Stream.Name, 20)
	fault := &faulted{c: cluster, stream: cfg.NATS.Stream.Name, bridge: cfg.NATS.Name, connected: connectedTo(cluster, cfg.NATS.Name)}
	for _, s := range cluster.Servers {
		if name := s.Server.Name(); (name == fault.connected) == f.leadsConnected {
			fault.leader = name
			break
		}
	}
	lead(t, nc, cfg.NATS.Stream.Name, fault.leader)
	lead(t, nc, "KV_"+cfg.Records.Bucket, fault.leader)
	// The stream is read through the server that neither leads nor has
	// the bridge: the one a partition leaves in the majority.
	var witness *stack.NATS
	for _, s := range cluster.Servers {
		if name := s.Server.Name(); name != fault.leader && name != fault.connected {
			witness = s
		}
	}
	nc, err := nats.Connect(witness.URL()+","+cluster.URL(), nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	failed := publishErrors(t)
	// The fault strikes in the middle of 40 creates, so that publishes are
	// in flight; the other half of them, 10 updates and 5 deletes are made
	// once the cluster has reacted to it (a new leader, a reconnection).
	var heal func()
	var t0 time.Time
	for i := 20; i < 60; i++ {
		switch i {
		case 30:
			t0 = time.Now()
			heal = f.inject(t, fault)
		case 45:
			stacktest.WaitFor(t, f.name+": the reaction", func() error { return f.reacted(fault) })
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
	agrees := func() error { return streamAgrees(ctx, nc, cfg) }
	if f.beforeHeal {
		stacktest.WaitFor(t, "the stream telling the truth about every Student before the fault heals", agrees)
	}
	struck := time.Since(t0)
	t1 := time.Now()
	heal()
	stacktest.WaitFor(t, "the stream telling the truth about every Student", agrees)
	after := publishErrors(t)
	byReason := map[string]float64{}
	for reason, n := range after {
		if d := n - failed[reason]; d > 0 {
			byReason[reason] = d
		}
	}
	t.Logf("fault report: %s (stream leader %s, bridge connected to %s) for %s while 55 Students changed: lost 0, duplicates 0, out of order 0; everything published %s after it healed; publishes failed and retried meanwhile, by reason: %v",
		f.name, fault.leader, fault.connected, struck.Round(100*time.Millisecond), time.Since(t1).Round(100*time.Millisecond), byReason)
	// A fault of the cluster is its state for a while: no publish may be
	// counted as the broker refusing the event, or as an error of no kind.
	if byReason["rejected"] > 0 || byReason["other"] > 0 {
		t.Errorf("%s: publishes counted as rejected or unclassified: %v", f.name, byReason)
	}
	// Nor is it a Warning Event on a Student.
	var events eventsv1.EventList
	if err := st.Client.List(ctx, &events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if e.Type == corev1.EventTypeWarning && (strings.Contains(e.Note, sink.ErrUnavailable.Error()) || strings.Contains(e.Note, sink.ErrRejected.Error())) {
			t.Errorf("%s: a Warning Event on %s: %s", f.name, e.Regarding.Name, e.Note)
			break
		}
	}
}

// onCluster points cfg at a three-node cluster of the test's own, the
// stream and buckets at three replicas, and returns it and a connection to
// it.
func onCluster(t *testing.T, cfg *config.Config) (*stack.NATSCluster, *nats.Conn) {
	t.Helper()
	cluster, err := stack.StartNATSCluster(3, stack.NATSClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Stop)
	cfg.NATS.URLs = cluster.URL()
	cfg.NATS.Stream.Replicas, cfg.Records.Replicas = 3, 3
	nc, err := nats.Connect(cluster.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return cluster, nc
}

// lead makes the server named name lead stream.
func lead(t *testing.T, nc *nats.Conn, stream, name string) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	req := fmt.Sprintf(`{"placement":{"preferred":%q}}`, name)
	stacktest.WaitFor(t, stream+" led by "+name, func() error {
		s, err := js.Stream(context.Background(), stream)
		if err != nil {
			return err
		}
		if l := s.CachedInfo().Cluster.Leader; l != name {
			_, err := nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, []byte(req), time.Second)
			return fmt.Errorf("led by %s (step down: %v)", l, err)
		}
		return nil
	})
}

// connectedTo is the name of the server that the connection named name is
// connected to, or "" if none.
func connectedTo(c *stack.NATSCluster, name string) string {
	for _, s := range c.Servers {
		if s.Server == nil || !s.Server.Running() {
			continue
		}
		conns, err := s.Server.Connz(&natsserver.ConnzOptions{})
		if err != nil {
			continue
		}
		for _, conn := range conns.Conns {
			if conn.Name == name {
				return s.Server.Name()
			}
		}
	}
	return ""
}

// publishErrors is how many publishes failed in this test binary so far,
// by reason.
func publishErrors(t *testing.T) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, reason := range []string{"unavailable", "not_connected", "rejected", "too_large", "closed", "conflict", "other"} {
		out[reason] = counter(t, "student_bridge_publish_errors_total", map[string]string{"reason": reason})
	}
	return out
}

// streamAgrees is `student-bridge verify` with no grace: the stream, the
// record store and the API server agree about every Student of cfg's scope.
func streamAgrees(ctx context.Context, nc *nats.Conn, cfg *config.Config) error {
	r, err := verify.Verify(ctx, verifySource(cfg, nc), verify.Options{})
	if err != nil {
		return err
	}
	return r.Err()
}
