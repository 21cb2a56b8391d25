package fleet_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/fleet"
	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// cluster is one cluster's NATS of the fleet, with what its bridge would
// make in it: the stream and the receipts bucket, sourcing its receipts
// from the hub.
type cluster struct {
	name     string
	nats     *stack.NATS
	js       jetstream.JetStream
	receipts jetstream.KeyValue
}

func startFleet(t *testing.T, names ...string) (*stack.Hub, map[string]*cluster) {
	t.Helper()
	hub, err := stack.StartHub()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hub.Stop)
	ctx := context.Background()
	out := map[string]*cluster{}
	for _, name := range names {
		o, err := hub.Leaf(name)
		if err != nil {
			t.Fatal(err)
		}
		n, err := stack.StartNATS(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Stop)
		if err := stack.WaitLinked(n.URL(), 30*time.Second); err != nil {
			t.Fatal(err)
		}
		nc := stacktest.Connect(t, n.URL())
		js, _ := jetstream.New(nc)
		if _, err := natssink.EnsureStream(ctx, js, natssink.StreamConfig{Name: studentv1.DefaultStream, Subject: studentv1.DefaultSubjects, Storage: "file", Replicas: 1}, true); err != nil {
			t.Fatal(err)
		}
		src := fleet.ReceiptsSource(stack.HubDomain, studentv1.FleetReceiptsBucket, name, studentv1.ReceiptsBucket)
		if _, err := natssink.EnsureBucket(ctx, nc, natssink.BucketConfig{Name: studentv1.ReceiptsBucket, Replicas: 1, Source: src}, true); err != nil {
			t.Fatal(err)
		}
		kv, err := js.KeyValue(ctx, studentv1.ReceiptsBucket)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = &cluster{name: name, nats: n, js: js, receipts: kv}
	}
	return hub, out
}

// TestTopology: each cluster's stream and buckets hold only what was
// written in that cluster, though every cluster uses the same subjects and
// names; the hub's stream sources every cluster's events once, under the
// cluster's subjects; a receipt written on the hub reaches only its
// cluster's bucket, also when it was written while the cluster's link was
// cut.
func TestTopology(t *testing.T) {
	hub, clusters := startFleet(t, "east", "west")
	ctx := context.Background()
	for _, c := range clusters {
		for i := range 3 {
			if _, err := c.js.Publish(ctx, "student.created", fmt.Appendf(nil, "%s-%d", c.name, i), jetstream.WithMsgID(fmt.Sprintf("%s-%d", c.name, i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range clusters {
		st, err := c.js.Stream(ctx, studentv1.DefaultStream)
		if err != nil {
			t.Fatal(err)
		}
		if info, err := st.Info(ctx); err != nil || info.State.Msgs != 3 {
			t.Fatalf("stream of %s holds %d events (%v), want its own 3: the leaf node connection carries another cluster's", c.name, info.State.Msgs, err)
		}
	}

	hnc := stacktest.Connect(t, hub.URL())
	added, err := fleet.EnsureHub(ctx, hnc, fleet.Hub{Clusters: []string{"east", "west"}})
	if err != nil || !slices.Equal(added, []string{"east", "west"}) {
		t.Fatalf("EnsureHub added %v, %v", added, err)
	}
	if added, err := fleet.EnsureHub(ctx, hnc, fleet.Hub{Clusters: []string{"west", "east"}}); err != nil || len(added) != 0 {
		t.Fatalf("EnsureHub again added %v, %v; want nothing", added, err)
	}
	hjs, _ := jetstream.New(hnc)
	fs, err := hjs.Stream(ctx, studentv1.FleetStream)
	if err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, "the hub's stream sources both clusters", func() error {
		seen := map[string]int{}
		info, err := fs.Info(ctx)
		if err != nil {
			return err
		}
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
			m, err := fs.GetMsg(ctx, seq)
			if err != nil {
				return err
			}
			seen[m.Subject+" "+string(m.Data)]++
		}
		for _, c := range []string{"east", "west"} {
			for i := range 3 {
				if k := fmt.Sprintf("student.%s.created %s-%d", c, c, i); seen[k] != 1 {
					return fmt.Errorf("%q %d times on the hub (all: %v)", k, seen[k], seen)
				}
			}
		}
		if len(seen) != 6 {
			return fmt.Errorf("hub holds %v, want 6 events", seen)
		}
		return nil
	})

	hkv, err := hjs.KeyValue(ctx, studentv1.FleetReceiptsBucket)
	if err != nil {
		t.Fatal(err)
	}
	put := func(cluster, uid string) {
		t.Helper()
		if _, err := hkv.Put(ctx, studentv1.FleetReceiptKey(cluster, "billing", uid), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	put("east", "u1")
	put("west", "u2")
	hub.Link("west").Cut()
	put("west", "u3")
	// A receipt for east put after u3 arrives: the hub has u3 on its way
	// too, and only the cut link holds it back from west.
	put("east", "u4")
	waitKeys(t, clusters["east"], "billing.u1", "billing.u4")
	if keys := keysOf(t, clusters["west"]); slices.Contains(keys, "billing.u3") {
		t.Fatalf("west has %v with its link cut", keys)
	}
	hub.Link("west").Heal()
	waitKeys(t, clusters["west"], "billing.u2", "billing.u3")
	waitKeys(t, clusters["east"], "billing.u1", "billing.u4")
}

func keysOf(t *testing.T, c *cluster) []string {
	t.Helper()
	keys, err := c.receipts.ListKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for k := range keys.Keys() {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// waitKeys waits until c's receipts bucket holds exactly want.
func waitKeys(t *testing.T, c *cluster, want ...string) {
	t.Helper()
	stacktest.WaitFor(t, c.name+"'s receipts", func() error {
		if got := keysOf(t, c); !slices.Equal(got, want) {
			return fmt.Errorf("%s holds %v, want %v", c.name, got, want)
		}
		return nil
	})
}
