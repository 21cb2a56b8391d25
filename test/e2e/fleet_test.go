package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/consumer"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// TestFleet runs two clusters (two control planes, each with its bridge
// process and a NATS of its own, a leaf node of one hub) as docs/fleet.md
// lays them out, with a service on the hub (a consumer.Mirror over the
// hub's stream). Both clusters change at once; then west's leaf node link
// is cut while both change again, and healed. Every cluster's events reach
// the hub once each and in the cluster's own order, west's bridge keeps
// publishing locally while cut off, and the hub service's receipts reach
// the Students in both clusters, one written while the link was cut too.
func TestFleet(t *testing.T) {
	hub, err := stack.StartHub()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hub.Stop)
	names := []string{"east", "west"}
	clusters := map[string]*world{}
	for _, name := range names {
		opts, err := hub.Leaf(name)
		if err != nil {
			t.Fatal(err)
		}
		w := newWorldWith(t, stack.Options{NATS: opts, FinalizerPolicy: true})
		w.cluster = name
		if err := stack.WaitLinked(w.st.NATSURL(), 30*time.Second); err != nil {
			t.Fatal(err)
		}
		clusters[name] = w
	}
	t.Logf("student-bridge hub: %s", command(t, "hub", "--nats-url", hub.URL(), "--clusters", strings.Join(names, ",")))
	for _, name := range names {
		w := clusters[name]
		p := start(t, t.TempDir(), w.bridgeArgs(w.admin, "--cluster", name, "--fleet-hub-domain", stack.HubDomain, "--expected-services", "billing")...)
		p.waitOutput(t, `"receipts loaded"`, time.Minute)
	}

	hnc := stacktest.Connect(t, hub.URL())
	m := runMirror(t, hnc, consumer.MirrorOptions{Service: "billing"})

	const ns = "fleet"
	both := func(prefix string, n int) {
		var wg sync.WaitGroup
		for _, w := range clusters {
			wg.Go(func() { burst(t, w, ns, prefix, n, nil) })
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
	}
	for _, w := range clusters {
		ensureNamespace(t, w.st.Client, ns)
	}
	both("s", 12)
	for _, name := range names {
		clusters[name].waitVerified(t, ns, time.Minute)
		waitOnHub(t, hnc, clusters[name])
	}
	for _, name := range names {
		waitInSync(t, clusters[name], ns, "billing")
	}
	checkMirror(t, m, clusters)

	// West's link is cut: west goes on publishing into its own stream,
	// which the hub cannot read meanwhile.
	west := clusters["west"]
	onHub := len(hubEvents(t, hnc, "west"))
	hub.Link("west").Cut()
	both("cut", 6)
	for _, name := range names {
		clusters[name].waitVerified(t, ns, time.Minute)
	}
	waitOnHub(t, hnc, clusters["east"])
	// A receipt for a west Student, written on the hub while the link is
	// cut, by a service that reports by hand.
	audited := student(t, west, ns, "s-1")
	rep, err := consumer.NewReporter(context.Background(), hnc, "audit", studentv1.FleetReceiptsBucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Report(context.Background(), studentv1.Receipt{Cluster: "west", UID: string(audited.UID), Namespace: ns, Name: audited.Name,
		EventID: audited.Status.LastPublished.ID, Generation: audited.Generation, Result: studentv1.ResultApplied}); err != nil {
		t.Fatal(err)
	}
	if n := len(hubEvents(t, hnc, "west")); n != onHub {
		t.Fatalf("the hub holds %d of west's events with the link cut, had %d before", n, onHub)
	}
	hub.Link("west").Heal()
	healed := time.Now()
	waitOnHub(t, hnc, west)
	t.Logf("fleet report: the hub held %d of west's events when cut off, all %d %s after the heal",
		onHub, len(hubEvents(t, hnc, "west")), time.Since(healed).Round(10*time.Millisecond))
	waitOnHub(t, hnc, clusters["east"])
	for _, name := range names {
		waitInSync(t, clusters[name], ns, "billing")
	}
	stacktest.WaitFor(t, "the audit receipt shown on west's "+audited.Name, func() error {
		s := student(t, west, ns, audited.Name)
		for _, svc := range s.Status.Services {
			if svc.Name == "audit" && svc.State == studentv1.ServiceInSync {
				return nil
			}
		}
		return fmt.Errorf("services of %s: %+v", s.Name, s.Status.Services)
	})
	checkMirror(t, m, clusters)
	if g := m.Gaps(); g != 0 {
		t.Fatalf("the hub's mirror counted %d gaps", g)
	}

	// The commands, from the hub: each cluster's services, tail and a
	// snapshot of one cluster.
	students := map[string]int{}
	for _, name := range names {
		var list studentv1.StudentList
		if err := clusters[name].st.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		students[name] = len(list.Items)
		got := command(t, "services", "--nats-url", hub.URL(), "--cluster", name)
		if want := fmt.Sprintf(`billing\s+\d+\s+\d+\s+%d\s+0\s+0`, len(list.Items)); !regexp.MustCompile(want).MatchString(got) {
			t.Errorf("services --cluster %s:\n%s\nwant billing with %d in sync, none behind", name, got, len(list.Items))
		}
		lines := strings.Count(command(t, "tail", "--nats-url", hub.URL(), "--cluster", name, "--deliver", "all", "--follow=false", "-o", "json"), "\n")
		if n := len(hubEvents(t, hnc, name)); lines != n {
			t.Errorf("tail --cluster %s printed %d events, the hub holds %d of its", name, lines, n)
		}
	}
	if got := command(t, "snapshot", "--nats-url", hub.URL(), "--cluster", "west"); !strings.Contains(got, fmt.Sprintf("published %d Students", students["west"])) {
		t.Errorf("snapshot --cluster west: %s, want %d Students", got, students["west"])
	}
	waitOnHub(t, hnc, west)

	// A new service on the hub after older events left the hub's stream:
	// its Mirror asks every cluster for a snapshot and rebuilds every
	// cluster's Students from them.
	js, err := jetstream.New(hnc)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := js.Stream(context.Background(), studentv1.FleetStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.Purge(context.Background(), jetstream.WithPurgeKeep(1)); err != nil {
		t.Fatal(err)
	}
	checkMirror(t, runMirror(t, hnc, consumer.MirrorOptions{Service: "ledger", SnapshotTimeout: 30 * time.Second}), clusters)
}

// runMirror runs a Mirror with Fleet on the hub, whose handler applies
// every change at once, until the test ends.
func runMirror(t *testing.T, hnc *nats.Conn, o consumer.MirrorOptions) *consumer.Mirror {
	t.Helper()
	o.Fleet = true
	o.Handler = func(context.Context, consumer.Change) error { return nil }
	m, err := consumer.NewMirror(hnc, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("mirror of %s: %v", o.Service, err)
		}
	})
	return m
}

// command runs student-bridge with args and returns its standard output.
func command(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(binary, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("student-bridge %v: %v\n%s%s", args, err, out, stderr.String())
	}
	return string(out)
}

// hubEvents are the events of cluster in the hub's stream, in its order.
func hubEvents(t *testing.T, hnc *nats.Conn, cluster string) []stacktest.Received {
	t.Helper()
	all, err := stacktest.StreamEvents(context.Background(), hnc, studentv1.FleetStream)
	if err != nil {
		t.Fatal(err)
	}
	var out []stacktest.Received
	for _, e := range all {
		if strings.HasPrefix(e.Subject, "student."+cluster+".") {
			out = append(out, e)
		}
	}
	return out
}

// waitOnHub waits until the hub's stream holds the cluster's events as its
// own stream does: each once, in the same order, on the cluster's subjects
// (student.created as student.<cluster>.created), naming the cluster as
// their source.
func waitOnHub(t *testing.T, hnc *nats.Conn, w *world) {
	t.Helper()
	stacktest.WaitFor(t, "the hub holds "+w.cluster+"'s stream", func() error {
		local, err := stacktest.StreamEvents(context.Background(), w.nc, w.stream)
		if err != nil {
			return err
		}
		hub := hubEvents(t, hnc, w.cluster)
		if len(hub) != len(local) {
			return fmt.Errorf("the hub holds %d of %s's %d events", len(hub), w.cluster, len(local))
		}
		for i := range local {
			l, h := local[i], hub[i]
			want := "student." + w.cluster + "." + strings.TrimPrefix(l.Subject, "student.")
			if h.Event.ID() != l.Event.ID() || h.Subject != want || studentv1.ClusterOfSource(h.Event.Source()) != w.cluster {
				return fmt.Errorf("event %d of %s: %s on %s from %s on the hub, %s on %s in the cluster", i, w.cluster,
					h.Event.ID(), h.Subject, h.Event.Source(), l.Event.ID(), l.Subject)
			}
		}
		return nil
	})
}

// waitInSync waits until every Student of ns shows service in sync.
func waitInSync(t *testing.T, w *world, ns, service string) {
	t.Helper()
	stacktest.WaitFor(t, w.cluster+"'s Students in sync with "+service, func() error {
		var list studentv1.StudentList
		if err := w.st.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, s := range list.Items {
			if s.Status.ServicesInSync != "1/1" {
				b, _ := json.Marshal(s.Status.Services)
				return fmt.Errorf("%s shows %q: %s", s.Name, s.Status.ServicesInSync, b)
			}
		}
		return nil
	})
}

func student(t *testing.T, w *world, ns, name string) *studentv1.Student {
	t.Helper()
	var s studentv1.Student
	if err := w.st.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// checkMirror compares the hub mirror's state with every cluster's
// Students: one entry per cluster and uid, with the Student's spec.
func checkMirror(t *testing.T, m *consumer.Mirror, clusters map[string]*world) {
	t.Helper()
	stacktest.WaitFor(t, "the hub's mirror holds every cluster's Students", func() error {
		want := map[string]studentv1.StudentSpec{}
		for name, w := range clusters {
			var list studentv1.StudentList
			if err := w.st.Client.List(context.Background(), &list); err != nil {
				return err
			}
			for _, s := range list.Items {
				want[consumer.Key(name, string(s.UID))] = s.Spec
			}
		}
		got := m.State()
		for k, spec := range want {
			if d, ok := got[k]; !ok || d.Spec != spec {
				return fmt.Errorf("mirror has %s as %+v (present %v), want %+v", k, d.Spec, ok, spec)
			}
		}
		if len(got) != len(want) {
			keys := slices.Sorted(func(yield func(string) bool) {
				for k := range got {
					if _, ok := want[k]; !ok && !yield(k) {
						return
					}
				}
			})
			return fmt.Errorf("mirror holds %d Students, the clusters %d; extra: %v", len(got), len(want), keys)
		}
		return nil
	})
}
