package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// Each fault test drives creates, updates and deletes, injects the fault,
// lets the system recover and checks the stream against the API server with
// world.verify. The counts go to the test log as "fault report".

// burst makes n Students, updates each twice and deletes every third.
func burst(t *testing.T, w *world, ns, prefix string, n int, during func(i int)) {
	t.Helper()
	for i := range n {
		w.create(t, ns, fmt.Sprintf("%s-%d", prefix, i), "s0")
		if during != nil {
			during(i)
		}
	}
	for i := range n {
		w.update(t, ns, fmt.Sprintf("%s-%d", prefix, i), "s1")
		w.update(t, ns, fmt.Sprintf("%s-%d", prefix, i), "s2")
	}
	for i := 0; i < n; i += 3 {
		w.delete(t, ns, fmt.Sprintf("%s-%d", prefix, i))
	}
}

func TestKillMidBurst(t *testing.T) {
	w := newWorld(t)
	p := start(t, t.TempDir(), w.bridgeArgs(w.admin)...)
	p.waitOutput(t, "Starting workers", 60*time.Second)

	burst(t, w, "default", "kill", 30, func(i int) {
		if i == 15 {
			if err := p.stop(t, syscall.SIGKILL); err == nil {
				t.Fatal("SIGKILL reported a clean exit")
			}
		}
	})
	faultEnd := time.Now()
	start(t, t.TempDir(), w.bridgeArgs(w.admin)...)
	r := w.waitVerified(t, "default", 90*time.Second)
	r.Recovery = time.Since(faultEnd)
	t.Logf("fault report: SIGKILL mid-burst: %s", r)
}

// TestDeletesWhileBridgeDown: Students deleted while no bridge runs get
// their deleted event when one starts again, with either delete policy: the
// finalizer holds them, or the record store remembers them (and then the
// bridge writes nothing to Students at all, by the API server's count).
func TestDeletesWhileBridgeDown(t *testing.T) {
	for _, tc := range []struct {
		name string
		hold bool
	}{{"finalizer", true}, {"no-finalizer", false}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			w.inexactDeletes = !tc.hold
			args := w.bridgeArgs(w.admin, fmt.Sprintf("--hold-deletes-with-finalizer=%t", tc.hold))
			patches := studentPatches(t, w)
			p := start(t, t.TempDir(), args...)
			for i := range 10 {
				w.create(t, "default", fmt.Sprintf("down-%d", i), "s0")
			}
			w.waitVerified(t, "default", 60*time.Second)
			if err := p.stop(t, syscall.SIGTERM); err != nil {
				t.Fatalf("SIGTERM: %v", err)
			}
			for i := range 5 {
				w.delete(t, "default", fmt.Sprintf("down-%d", i))
			}
			w.update(t, "default", "down-7", "changed while down")
			if tc.hold {
				// The finalizer holds the deleted Students while nobody can publish.
				w.requireHeld(t, "default", "down-0", "while the bridge is down")
			}
			faultEnd := time.Now()
			start(t, t.TempDir(), args...)
			r := w.waitVerified(t, "default", 60*time.Second)
			r.Recovery = time.Since(faultEnd)
			bridgePatches := studentPatches(t, w) - patches - w.patches
			if !tc.hold && bridgePatches != 0 {
				t.Errorf("without the finalizer policy the bridge patched Students %d times, want 0", bridgePatches)
			}
			t.Logf("fault report: deletes while the bridge is down (%s): %s, Student patches by the bridge %d", tc.name, r, bridgePatches)
		})
	}
}

func TestNATSOutages(t *testing.T) {
	w := newWorld(t)
	// NATS unreachable when the bridge starts.
	w.st.NATS.Shutdown()
	p := start(t, t.TempDir(), w.bridgeArgs(w.admin)...)
	p.waitOutput(t, "NATS not reachable yet", 30*time.Second)
	for i := range 5 {
		w.create(t, "default", fmt.Sprintf("early-%d", i), "s0")
	}
	if err := w.st.NATS.Restart(); err != nil {
		t.Fatal(err)
	}
	r := w.waitVerified(t, "default", 60*time.Second)
	t.Logf("fault report: NATS unreachable at startup: %s", r)

	// NATS stopped mid-stream and restarted with the same store.
	var once sync.Once
	restarted := make(chan error, 1)
	burst(t, w, "default", "mid", 20, func(i int) {
		if i == 5 {
			w.st.NATS.Shutdown()
		}
		if i == 15 {
			once.Do(func() { restarted <- w.st.NATS.Restart() })
		}
	})
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	faultEnd := time.Now()
	r = w.waitVerified(t, "default", 90*time.Second)
	r.Recovery = time.Since(faultEnd)
	t.Logf("fault report: NATS stopped mid-stream: %s", r)
	if !strings.Contains(p.output(), "disconnected from NATS") || !strings.Contains(p.output(), "reconnected to NATS") {
		t.Errorf("the outage is not in the bridge's log")
	}
}

func TestLeaderFailover(t *testing.T) {
	w := newWorld(t)
	args := w.bridgeArgs(w.admin, "--leader-elect=true", "--leader-election-namespace=default",
		"--leader-election-lease-duration=6s", "--leader-election-renew-deadline=4s", "--leader-election-retry-period=1s")
	a := start(t, t.TempDir(), args...)
	a.waitOutput(t, "Successfully acquired lease", 60*time.Second)
	b := start(t, t.TempDir(), args...)
	b.waitOutput(t, "Attempting to acquire leader lease", 60*time.Second)
	for i := range 10 {
		w.create(t, "default", fmt.Sprintf("lead-%d", i), "s0")
	}
	w.waitVerified(t, "default", 60*time.Second)
	if strings.Contains(b.output(), "Successfully acquired lease") {
		t.Fatal("both replicas lead")
	}

	// A core subscriber sees every publish over the handover, also copies
	// the stream's duplicate window would drop.
	sub, err := stacktest.Subscribe(w.nc, "student.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.stop(t, syscall.SIGKILL); err == nil {
		t.Fatal("SIGKILL reported a clean exit")
	}
	killed := time.Now()
	burst(t, w, "default", "gap", 10, nil)
	b.waitOutput(t, "Successfully acquired lease", 60*time.Second)
	takeover := time.Since(killed)
	r := w.waitVerified(t, "default", 60*time.Second)
	r.Recovery = time.Since(killed)
	got, err := sub.Events()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, e := range got {
		if !strings.HasPrefix(e.Data.Metadata.Name, "gap-") {
			t.Errorf("%s %s published again after the handover", e.Event.Type(), e.Data.Metadata.Name)
		}
		if ids[e.Event.ID()] {
			t.Errorf("%s %s (id %s) published twice over the handover", e.Event.Type(), e.Data.Metadata.Name, e.Event.ID())
		}
		ids[e.Event.ID()] = true
	}
	t.Logf("fault report: leader SIGKILLed: takeover after %s (lease 6s, retry 1s), %s", takeover.Round(100*time.Millisecond), r)
}

func TestStreamFull(t *testing.T) {
	w := newWorld(t)
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", stacktest.FreePorts(t, 1))
	start(t, t.TempDir(), w.bridgeArgs(w.admin, "--stream-max-msgs=5", "--stream-discard=new", "--metrics-bind-address", metricsAddr)...)
	// The deleted events the bridge tried to publish and could not.
	deletesFailed := func() float64 {
		n := 0.0
		for series, v := range scrape(t, metricsAddr) {
			if strings.HasPrefix(series, "student_bridge_events_published_total{") && strings.Contains(series, `result="error"`) &&
				strings.Contains(series, studentv1.EventTypeDeleted) {
				n += v
			}
		}
		return n
	}
	ctx := context.Background()
	for i := range 8 {
		w.create(t, "default", fmt.Sprintf("full-%d", i), "s0")
	}
	var failed []string
	if err := stacktest.Eventually(60*time.Second, func() error {
		var list studentv1.StudentList
		if err := w.st.Client.List(ctx, &list, client.InNamespace("default")); err != nil {
			return err
		}
		failed = nil
		published := 0
		for _, s := range list.Items {
			c := meta.FindStatusCondition(s.Status.Conditions, studentv1.ConditionPublished)
			switch {
			case c != nil && c.Status == metav1.ConditionTrue:
				published++
			case c != nil && c.Status == metav1.ConditionFalse && c.Reason == studentv1.ReasonPublishFailed && strings.Contains(c.Message, "maximum messages"):
				failed = append(failed, s.Name)
			}
		}
		if published != 5 || len(failed) != 3 {
			return fmt.Errorf("published %d, failed %v", published, failed)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := stacktest.Eventually(30*time.Second, func() error {
		var evs eventsv1.EventList
		if err := w.st.Client.List(ctx, &evs, client.InNamespace("default")); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning && e.Reason == studentv1.ReasonPublishFailed && strings.Contains(e.Note, "maximum messages") {
				return nil
			}
		}
		return fmt.Errorf("no Warning event about the full stream")
	}); err != nil {
		t.Fatal(err)
	}
	// A delete while the stream is full is held by the finalizer: its
	// publish refused again and again, the Student stays.
	before := deletesFailed()
	w.delete(t, "default", "full-0")
	if err := stacktest.Eventually(30*time.Second, func() error {
		if n := deletesFailed() - before; n < 3 {
			return fmt.Errorf("the deleted event was refused %v times, want 3", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var s studentv1.Student
	if err := w.st.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "full-0"}, &s); apierrors.IsNotFound(err) {
		t.Fatal("a delete went through while its event could not be stored")
	}

	// Space: purge the stream. Everything flows.
	js, _ := jetstream.New(w.nc)
	str, err := js.Stream(ctx, w.stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := str.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	if err := stacktest.Eventually(60*time.Second, func() error {
		events, err := stacktest.StreamEvents(ctx, w.nc, w.stream)
		if err != nil {
			return err
		}
		names := map[string]bool{}
		for _, e := range events {
			names[e.Data.Metadata.Name+" "+e.Event.Type()] = true
		}
		for _, n := range failed {
			if !names[n+" "+studentv1.EventTypeCreated] {
				return fmt.Errorf("%s not published after the purge: %v", n, names)
			}
		}
		if !names["full-0 "+studentv1.EventTypeDeleted] {
			return fmt.Errorf("held delete not published: %v", names)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("fault report: stream full (max 5, discard new): 3 refused, 1 delete held; all published %s after space was made", time.Since(freed).Round(10*time.Millisecond))
}

// TestRecordStoreDeniedPublishesNothing: a bridge whose NATS user may not
// write the record store cannot reserve an update's number, so it
// publishes nothing, and is killed; the next bridge publishes the update
// once (a core subscriber, which no duplicate window protects, sees it
// once) and records it. The crash between an ack and its record is
// TestCrashBeforeTheRecordRepublishes in reconciler.
func TestRecordStoreDeniedPublishesNothing(t *testing.T) {
	w := newWorldWith(t, stack.Options{NATS: stack.NATSOptions{Configure: func(o *natsserver.Options) {
		noRecord := &natsserver.Permissions{Publish: &natsserver.SubjectPermission{Deny: []string{"$KV.STUDENT_BRIDGE_PUBLISHED.>"}}}
		o.Users = []*natsserver.User{{Username: "full", Password: "full"}, {Username: "norecord", Password: "norecord", Permissions: noRecord}}
		o.NoAuthUser = "full"
	}}})
	ctx := context.Background()
	sub, err := stacktest.Subscribe(w.nc, "student.>")
	if err != nil {
		t.Fatal(err)
	}
	p := w.startAndPublish(t, w.bridgeArgs(w.admin)...)
	if err := p.stop(t, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}

	w.update(t, "default", "object-name", "beijing")
	args := append(w.bridgeArgs(w.admin, "--nats-user", "norecord"), "--nats-ack-timeout", "1s")
	p = startWithEnv(t, []string{"STUDENT_BRIDGE_NATS_AUTH_PASSWORD=norecord"}, args...)
	p.waitOutput(t, "before it goes out", 60*time.Second)
	if err := p.stop(t, syscall.SIGKILL); err == nil {
		t.Fatal("SIGKILL reported a clean exit")
	}
	events, err := stacktest.StreamEvents(ctx, w.nc, w.stream)
	if err != nil || len(events) != 1 {
		t.Fatalf("before the crash the stream holds %d events (%v), want created only", len(events), err)
	}

	start(t, t.TempDir(), w.bridgeArgs(w.admin)...)
	kv := recordStore(t, w.nc)
	var s studentv1.Student
	if err := w.st.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "object-name"}, &s); err != nil {
		t.Fatal(err)
	}
	var updated string
	if err := stacktest.Eventually(60*time.Second, func() error {
		rec, err := kv.Get(ctx, string(s.UID))
		if err != nil {
			return err
		}
		var sr studentv1.StudentRecord
		if err := json.Unmarshal(rec.Value(), &sr); err != nil {
			return err
		}
		if sr.Pending || sr.Published.Type != studentv1.EventTypeUpdated {
			return fmt.Errorf("record holds %s %s (pending %t), want the update published", sr.Published.Type, sr.Published.ID, sr.Pending)
		}
		updated = sr.Published.ID
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The record is written after the update's ack, so the stream holds
	// it. One run read the stream right after the record and saw only the
	// created event (not reproduced since): the read is repeated for a
	// moment, and a lag is logged, so that a second sighting says more.
	var after []stacktest.Received
	recorded := time.Now()
	if err := stacktest.Eventually(10*time.Second, func() error {
		var err error
		if after, err = stacktest.StreamEvents(ctx, w.nc, w.stream); err == nil && len(after) != 2 {
			err = fmt.Errorf("stream holds %d events after the next bridge, want 2", len(after))
		}
		return err
	}); err != nil {
		t.Error(err)
	} else if lag := time.Since(recorded); lag > 100*time.Millisecond {
		t.Logf("the stream showed the update %s after its record", lag.Round(time.Millisecond))
	}
	// The core subscriber's handler runs on a goroutine of its own: the
	// update can be on its way to it while the stream holds it already.
	copies := 0
	var decodeErr error
	_ = stacktest.Eventually(10*time.Second, func() error {
		var got []stacktest.Received
		got, decodeErr = sub.Events()
		copies = 0
		for _, r := range got {
			if r.Event.ID() == updated {
				copies++
			}
		}
		if copies == 0 && decodeErr == nil {
			return fmt.Errorf("the update is not seen yet")
		}
		return nil
	})
	if decodeErr != nil {
		t.Fatal(decodeErr)
	}
	if copies != 1 {
		t.Errorf("core subscriber saw the update %s %d times, want once (nothing published without a reservation)", updated, copies)
	}
	t.Logf("fault report: record store denied: nothing published until a bridge could reserve; update %s published once (events in stream: %d)", updated, len(after))
}

// TestSlowConsumerDoesNotBlock: consumers that fall behind on the bridge's
// own server, a durable nobody pulls, one that took a message and never
// acknowledges it, and a core subscriber stuck in its handler, do not hold
// the bridge back: every change of a second burst is published while they
// are behind. The time of that burst against the first (no slow consumers)
// is reported, not asserted: machines are noisy.
func TestSlowConsumerDoesNotBlock(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	start(t, t.TempDir(), w.bridgeArgs(w.admin)...)
	timed := func(prefix string) time.Duration {
		begin := time.Now()
		for i := range 50 {
			w.create(t, "default", fmt.Sprintf("%s-%d", prefix, i), "s0")
		}
		w.waitVerified(t, "default", 60*time.Second)
		return time.Since(begin)
	}
	baseline := timed("fast")

	js, err := jetstream.New(w.nc)
	if err != nil {
		t.Fatal(err)
	}
	absent, err := js.CreateConsumer(ctx, w.stream, jetstream.ConsumerConfig{Durable: "absent", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	unacked, err := js.CreateConsumer(ctx, w.stream, jetstream.ConsumerConfig{Durable: "unacked", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unacked.Next(jetstream.FetchMaxWait(5 * time.Second)); err != nil { // taken, never acknowledged
		t.Fatal(err)
	}
	stuck := make(chan struct{})
	defer close(stuck)
	stuckSub, err := w.nc.Subscribe("student.*", func(_ *natsMsg) { <-stuck })
	if err != nil {
		t.Fatal(err)
	}
	withSlow := timed("slow")

	for name, c := range map[string]jetstream.Consumer{"absent": absent, "unacked": unacked} {
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending < 50 {
			t.Errorf("consumer %s is not behind: %d pending", name, info.NumPending)
		}
	}
	if pending, _, err := stuckSub.Pending(); err != nil || pending < 50 {
		t.Errorf("the stuck subscriber is not behind: %d pending (%v)", pending, err)
	}
	t.Logf("fault report: absent, unacknowledging and stuck consumers: 50 changes published in %s, %s without them", withSlow.Round(10*time.Millisecond), baseline.Round(10*time.Millisecond))
}

// TestMinimalRBAC: the bridge works as a user bound only to the generated
// roles, and that user can neither create Students nor read Secrets.
func TestMinimalRBAC(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	ensureNamespace(t, w.st.Client, "student-bridge-system")
	kc := w.bridgeUser(t, "student-bridge", "student-bridge-system")
	p := start(t, t.TempDir(), w.bridgeArgs(kc, "--leader-elect=true", "--leader-election-namespace=student-bridge-system")...)
	p.waitOutput(t, "Successfully acquired lease", 60*time.Second)
	burst(t, w, "default", "rbac", 6, nil)
	r := w.waitVerified(t, "default", 60*time.Second)
	t.Logf("least-privilege bridge: %s", r)
	if strings.Contains(p.output(), "forbidden") {
		t.Errorf("the bridge was refused something it needs:\n%s", p.output())
	}

	c := userClient(t, w, "student-bridge")
	err := c.Create(ctx, &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "intruder"}, Spec: studentv1.StudentSpec{Name: "x", School: "y"}})
	if !apierrors.IsForbidden(err) {
		t.Errorf("the bridge's user could create a Student: %v", err)
	}
	if err := c.List(ctx, &corev1.SecretList{}); !apierrors.IsForbidden(err) {
		t.Errorf("the bridge's user could list Secrets: %v", err)
	}
	if err := c.Delete(ctx, &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "rbac-1"}}); !apierrors.IsForbidden(err) {
		t.Errorf("the bridge's user could delete a Student: %v", err)
	}
}

// TestAPIServerKilled: the API server dies and comes back (watches break, the
// informer relists). No change is lost and nothing already published is
// published again.
func TestAPIServerKilled(t *testing.T) {
	w := newWorld(t)
	start(t, t.TempDir(), w.bridgeArgs(w.admin)...)
	for i := range 10 {
		w.create(t, "default", fmt.Sprintf("api-%d", i), "s0")
	}
	before := w.waitVerified(t, "default", 60*time.Second)
	if err := stacktest.KillAPIServer(w.st); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	burst(t, w, "default", "after", 10, nil)
	w.update(t, "default", "api-3", "changed after the restart")
	r := w.waitVerified(t, "default", 90*time.Second)
	r.Recovery = time.Since(restarted)
	events, err := stacktest.StreamEvents(context.Background(), w.nc, w.stream)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events[before.Delivered:] {
		if strings.HasPrefix(e.Data.Metadata.Name, "api-") && e.Data.Metadata.Name != "api-3" {
			t.Errorf("republished %s %s after the API server came back", e.Event.Type(), e.Data.Metadata.Name)
		}
	}
	if r.Duplicates != 0 {
		t.Errorf("%d duplicates", r.Duplicates)
	}
	t.Logf("fault report: API server killed and restarted: %s", r)
}

// TestVanishedWithoutFinalizer: kube-apiserver can let a delete that races
// with the finalizer being added remove the Student anyway
// (kubernetes/kubernetes#77988). The bridge then publishes the deletion from
// its record. The race is forced here: while the bridge is paused, the
// finalizer is removed by hand and the Student deleted.
func TestVanishedWithoutFinalizer(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	p := w.startAndPublish(t, w.bridgeArgs(w.admin)...)

	// Paused, the bridge cannot put its finalizer back in between.
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var s studentv1.Student
	if err := w.st.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "object-name"}, &s); err != nil {
		t.Fatal(err)
	}
	orig := s.DeepCopy()
	s.Finalizers = nil
	if err := w.st.Client.Patch(ctx, &s, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
	w.delete(t, "default", "object-name")
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	r := w.waitVerified(t, "default", 60*time.Second)
	if r.Delivered != 2 {
		t.Errorf("stream holds %d events, want created and deleted", r.Delivered)
	}
	p.waitOutput(t, "gone without its finalizer", 10*time.Second)
	t.Logf("fault report: Student vanished without the finalizer: %s", r)
}
