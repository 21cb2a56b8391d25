package bridge_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/bridge"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/shards"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// TestReleaseFinalizersWaitsForTheLeader: while a bridge holds the Lease,
// release-finalizers touches no Student and says who leads; once the Lease
// expired it releases the Students in scope (and only those) and deletes
// the Lease.
func TestReleaseFinalizersWaitsForTheLeader(t *testing.T) {
	ctx := context.Background()
	ns, other := newNamespace(t), newNamespace(t)
	cfg, err := config.NewLoader(nil, config.BridgeCommand).Load("")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Namespaces = []string{ns}
	cfg.LabelSelector = "team=blue"
	cfg.LeaderElection.Namespace = ns
	cfg.LeaderElection.RetryPeriod = 100 * time.Millisecond

	held := func(namespace, name string, lbls map[string]string) *studentv1.Student {
		s := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: lbls, Finalizers: []string{studentv1.Finalizer}},
			Spec: studentv1.StudentSpec{Name: name, School: "china"}}
		if err := st.Client.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	blue := held(ns, "blue", map[string]string{"team": "blue"})
	deleting := held(ns, "deleting", map[string]string{"team": "blue"})
	red := held(ns, "red", map[string]string{"team": "red"})
	elsewhere := held(other, "blue", map[string]string{"team": "blue"})
	if err := st.Client.Delete(ctx, deleting); err != nil {
		t.Fatal(err)
	}

	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cfg.LeaderElection.ID}, Spec: coordinationv1.LeaseSpec{
		HolderIdentity: ptr.To("bridge-0"), LeaseDurationSeconds: ptr.To[int32](15), RenewTime: &metav1.MicroTime{Time: time.Now()},
	}}
	if err := st.Client.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if _, err := bridge.ReleaseFinalizers(ctx, cfg, st.RestConfig, time.Second); err == nil || !strings.Contains(err.Error(), `held by "bridge-0"`) {
		t.Fatalf("with the Lease held: %v, want an error naming the holder", err)
	}
	hasFinalizer := func(s *studentv1.Student) bool {
		var live studentv1.Student
		if err := st.Client.Get(ctx, client.ObjectKeyFromObject(s), &live); err != nil {
			return false
		}
		return controllerutil.ContainsFinalizer(&live, studentv1.Finalizer)
	}
	if !hasFinalizer(blue) || !hasFinalizer(deleting) {
		t.Fatal("a finalizer was removed while a bridge still leads")
	}

	// The holder stopped renewing 20 s ago: the Lease is free.
	lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-20 * time.Second)}
	if err := st.Client.Update(ctx, lease); err != nil {
		t.Fatal(err)
	}
	n, err := bridge.ReleaseFinalizers(ctx, cfg, st.RestConfig, time.Second)
	if err != nil || n != 2 {
		t.Fatalf("with the Lease expired: released %d, %v; want 2", n, err)
	}
	if hasFinalizer(blue) || !hasFinalizer(red) || !hasFinalizer(elsewhere) {
		t.Errorf("finalizers after release: in scope %v, other label %v, other namespace %v; want false, true, true", hasFinalizer(blue), hasFinalizer(red), hasFinalizer(elsewhere))
	}
	if err := st.Client.Get(ctx, client.ObjectKeyFromObject(deleting), &studentv1.Student{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Student being deleted is still held (%v)", err)
	}
	if err := st.Client.Get(ctx, client.ObjectKeyFromObject(lease), &coordinationv1.Lease{}); !apierrors.IsNotFound(err) {
		t.Errorf("the free Lease was not deleted (%v)", err)
	}
	for _, s := range []*studentv1.Student{red, elsewhere} {
		controllerutil.RemoveFinalizer(s, studentv1.Finalizer)
		_ = st.Client.Update(ctx, s)
	}
}

// TestReleaseFinalizersWaitsForEveryShard: with active-active replicas,
// release-finalizers waits until no shard Lease is held (while its holder's
// member Lease lives), then releases and
// deletes the Leases.
func TestReleaseFinalizersWaitsForEveryShard(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg, err := config.NewLoader(nil, config.BridgeCommand).Load("")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Namespaces = []string{ns}
	cfg.Shards.Count = 4
	cfg.LeaderElection.Namespace = ns
	cfg.LeaderElection.RetryPeriod = 100 * time.Millisecond
	stu := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "held", Finalizers: []string{studentv1.Finalizer}},
		Spec: studentv1.StudentSpec{Name: "wang", School: "china"}}
	if err := st.Client.Create(ctx, stu); err != nil {
		t.Fatal(err)
	}
	lease := func(name, role, holder string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cfg.LeaderElection.ID + name,
			Labels: map[string]string{shards.LabelBridge: cfg.LeaderElection.ID, shards.LabelRole: role}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder)}}
	}
	// A shard Lease is held while its holder's member Lease is live.
	free, held, orphan := lease("-shard-0", shards.RoleShard, ""), lease("-shard-1", shards.RoleShard, "bridge-1"), lease("-shard-2", shards.RoleShard, "bridge-2")
	member := lease("-member-bridge-1", shards.RoleMember, "bridge-1")
	member.Spec.LeaseDurationSeconds, member.Spec.RenewTime = ptr.To[int32](15), &metav1.MicroTime{Time: time.Now()}
	for _, l := range []*coordinationv1.Lease{free, held, orphan, member} {
		if err := st.Client.Create(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := bridge.ReleaseFinalizers(ctx, cfg, st.RestConfig, time.Second); err == nil || !strings.Contains(err.Error(), `held by "bridge-1"`) {
		t.Fatalf("with a shard held: %v, want an error naming the holder", err)
	}
	// bridge-1 stopped: its member Lease is gone, and its shard free.
	if err := st.Client.Delete(ctx, member); err != nil {
		t.Fatal(err)
	}
	if n, err := bridge.ReleaseFinalizers(ctx, cfg, st.RestConfig, time.Second); err != nil || n != 1 {
		t.Fatalf("with every shard free: released %d, %v; want 1", n, err)
	}
	for _, l := range []*coordinationv1.Lease{free, held, orphan} {
		if err := st.Client.Get(ctx, client.ObjectKeyFromObject(l), &coordinationv1.Lease{}); !apierrors.IsNotFound(err) {
			t.Errorf("Lease %s not deleted (%v)", l.Name, err)
		}
	}
}

// TestShardCountIsRecorded: the record store remembers the shard count; a
// bridge started with another one refuses to start and says why.
func TestShardCountIsRecorded(t *testing.T) {
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "shardcount")
	stop := startBridge(t, cfg)
	if err := stacktest.Eventually(30*time.Second, func() error {
		nc := natsConn(t)
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		kv, err := js.KeyValue(context.Background(), cfg.Records.Bucket)
		if err != nil {
			return err
		}
		e, err := kv.Get(context.Background(), "config.shards")
		if err != nil {
			return err
		}
		if string(e.Value()) != "1" {
			return fmt.Errorf("config.shards is %q", e.Value())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	stop()
	other := *cfg
	other.Shards.Count = 4
	other.LeaderElection.Namespace = ns
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := bridge.Run(ctx, &other, st.RestConfig)
	if err == nil || !strings.Contains(err.Error(), "shards.count is 4") || !strings.Contains(err.Error(), `written with "1" shards`) {
		t.Fatalf("a bridge with another shard count: %v, want a refusal naming shards.count", err)
	}
}

// TestReleaseFinalizersPages: release-finalizers lists Students a page at
// a time and releases every page, not the first alone (five Students, two
// to a page here; 500 in the command).
func TestReleaseFinalizersPages(t *testing.T) {
	ns := newNamespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const students = 5
	for i := range students {
		name := fmt.Sprintf("s%d", i)
		if err := st.Client.Create(ctx, &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Finalizers: []string{studentv1.Finalizer}},
			Spec: studentv1.StudentSpec{Name: name, School: "china"}}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := bridge.ReleaseNamespace(ctx, st.Client, ns, labels.Everything(), 2)
	if err != nil || n != students {
		t.Errorf("released %d of %d Students two to a page (%v)", n, students, err)
	}
	var list studentv1.StudentList
	if err := st.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Items {
		if controllerutil.ContainsFinalizer(&s, studentv1.Finalizer) {
			t.Errorf("%s still has the bridge's finalizer", s.Name)
		}
	}
}
