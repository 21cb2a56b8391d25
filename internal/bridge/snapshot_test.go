package bridge_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// TestSnapshots: a bridge with snapshot.onStartup publishes one snapshot
// event per Student and no change events; a request publishes a new
// snapshot, of all Students or of one namespace.
func TestSnapshots(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "snap")
	cfg.Snapshot.RequestSubject = "snap-bridge.snapshot"
	cfg.Snapshot.MinInterval = 0 // every request after a run ended makes a new one
	stop := startBridge(t, cfg)
	nc := natsConn(t)
	for _, name := range []string{"a", "b"} {
		if err := st.Client.Create(ctx, newStudent(ns, name, name, "school")); err != nil {
			t.Fatal(err)
		}
	}
	waitStream(t, nc, cfg.NATS.Stream.Name, 2)
	stop()

	cfg.Snapshot.OnStartup = true
	startBridge(t, cfg)
	got := waitStream(t, nc, cfg.NATS.Stream.Name, 4)
	startup := got[2:]
	created := map[string]stacktest.Received{}
	for _, r := range got[:2] {
		created[r.Data.Metadata.UID] = r
	}
	for _, r := range startup {
		if r.Event.Type() != studentv1.EventTypeSnapshot || r.Subject != "snap.snapshot" || r.Data.Spec.School != "school" {
			t.Errorf("startup snapshot event: %s on %s %+v", r.Event.Type(), r.Subject, r.Data)
		}
		// A copy of the last change: its sequence and its id.
		ext, last := r.Event.Extensions(), created[r.Data.Metadata.UID]
		if ext[studentv1.ExtensionSequence] != studentv1.FormatSequence(1) || ext[studentv1.ExtensionPreviousID] != last.Event.ID() {
			t.Errorf("snapshot of %s: sequence %v previousid %v, want %s and %s", r.Data.Metadata.Name,
				ext[studentv1.ExtensionSequence], ext[studentv1.ExtensionPreviousID], studentv1.FormatSequence(1), last.Event.ID())
		}
	}
	if startup[0].Data.Metadata.Name == startup[1].Data.Metadata.Name {
		t.Errorf("snapshot covers %s twice", startup[0].Data.Metadata.Name)
	}

	request := func(namespace string) studentv1.SnapshotReply {
		t.Helper()
		body, _ := json.Marshal(studentv1.SnapshotRequest{Namespace: namespace})
		msg, err := nc.Request(cfg.Snapshot.RequestSubject, body, 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var reply studentv1.SnapshotReply
		if err := json.Unmarshal(msg.Data, &reply); err != nil {
			t.Fatal(err)
		}
		return reply
	}
	if r := request(ns); r.Published != 2 || r.Error != "" {
		t.Errorf("request for %s published %d, want 2", ns, r.Published)
	}
	got = waitStream(t, nc, cfg.NATS.Stream.Name, 6)
	if got[4].Event.ID() == startup[0].Event.ID() || got[4].Event.ID() == startup[1].Event.ID() {
		t.Errorf("a new snapshot reused the id of the startup snapshot")
	}
	if r := request("not-watched"); r.Published != 0 || !strings.Contains(r.Error, "not watched") {
		t.Errorf("request for a namespace the bridge does not watch: %+v", r)
	}
	// The bridge watches ns only, so "all namespaces" means ns here.
	if r := request(""); r.Published != 2 || r.Error != "" {
		t.Errorf("request for all published %d, want 2", r.Published)
	}
	waitStream(t, nc, cfg.NATS.Stream.Name, 8)
}

// TestSnapshotsWithLeaderElection: of two replicas with leader election,
// only the leader publishes the startup snapshot and answers requests: one
// snapshot event per Student each time, not one per replica.
func TestSnapshotsWithLeaderElection(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "lead")
	cfg.Snapshot.RequestSubject = "lead-bridge.snapshot"
	cfg.Snapshot.MinInterval = 0 // the request makes a run of its own
	cfg.Snapshot.OnStartup = true
	cfg.LeaderElection.Enabled = true
	cfg.LeaderElection.Namespace = ns
	cfg.LeaderElection.ID = "snapshot-lease"
	nc := natsConn(t)
	for _, name := range []string{"a", "b"} {
		if err := st.Client.Create(ctx, newStudent(ns, name, name, "school")); err != nil {
			t.Fatal(err)
		}
	}
	startBridge(t, cfg)
	standby := *cfg
	startBridge(t, &standby)
	// The leader publishes the created events and its startup snapshot.
	waitStream(t, nc, cfg.NATS.Stream.Name, 4)

	body, _ := json.Marshal(studentv1.SnapshotRequest{})
	msg, err := nc.Request(cfg.Snapshot.RequestSubject, body, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var reply studentv1.SnapshotReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil || reply.Published != 2 {
		t.Fatalf("snapshot reply %s (%v), want 2 published", msg.Data, err)
	}
	got := waitStream(t, nc, cfg.NATS.Stream.Name, 6)
	snapshots := 0
	for _, r := range got {
		if r.Event.Type() == studentv1.EventTypeSnapshot {
			snapshots++
		}
	}
	if snapshots != 4 {
		t.Errorf("%d snapshot events, want 2 at startup and 2 on request: %v", snapshots, types(got))
	}
}

// TestSnapshotFloodIsCoalesced: ten services asking at once, then one in a
// crash loop asking at each start, then one asking for a namespace: one
// snapshot is published, and every request is answered by it, as long as
// snapshot.minInterval has not passed since it ended. After that, a
// request makes a new one.
func TestSnapshotFloodIsCoalesced(t *testing.T) {
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "flood")
	cfg.Snapshot.RequestSubject = "flood-bridge.snapshot"
	cfg.Snapshot.MinInterval = 8 * time.Second
	startBridge(t, cfg)
	nc := natsConn(t)
	const students = 20
	createStudents(t, ns, "s%02d", students)
	waitStream(t, nc, cfg.NATS.Stream.Name, students)
	request := func(namespace string) studentv1.SnapshotReply {
		body, _ := json.Marshal(studentv1.SnapshotRequest{Namespace: namespace})
		msg, err := nc.Request(cfg.Snapshot.RequestSubject, body, 30*time.Second)
		if err != nil {
			t.Error(err)
			return studentv1.SnapshotReply{}
		}
		var reply studentv1.SnapshotReply
		if err := json.Unmarshal(msg.Data, &reply); err != nil || reply.Error != "" {
			t.Errorf("reply %s (%v)", msg.Data, err)
		}
		return reply
	}
	counts := func() map[string]float64 {
		out := map[string]float64{}
		for _, r := range []string{"new_run", "coalesced", "refused"} {
			v, err := stacktest.Counter("student_bridge_snapshot_requests_total", "result", r)
			if err != nil {
				t.Fatal(err)
			}
			out[r] = v
		}
		return out
	}
	before := counts()

	replies := make([]studentv1.SnapshotReply, 10)
	var wg sync.WaitGroup
	for i := range replies {
		wg.Go(func() { replies[i] = request("") })
	}
	wg.Wait()
	for range 5 { // a service in a crash loop, asking at each start
		replies = append(replies, request(""))
	}
	replies = append(replies, request(ns))
	// Every request was answered, so every run was begun: the replies and
	// the counter below say how many, and the stream holds one snapshot.
	got := waitStream(t, nc, cfg.NATS.Stream.Name, 2*students)
	first := got[students].Sequence
	newRuns := 0
	for _, r := range replies {
		if r.Run != replies[0].Run || r.Published != students || r.FirstSequence != first || r.NextRun == "" {
			t.Errorf("reply %+v, want run %s of %d from stream sequence %d, and when the next may be", r, replies[0].Run, students, first)
		}
		if !r.Coalesced {
			newRuns++
		}
	}
	if newRuns != 1 {
		t.Errorf("%d replies say they made the run, want 1", newRuns)
	}
	after := counts()
	if d := after["new_run"] - before["new_run"]; d != 1 {
		t.Errorf("student_bridge_snapshot_requests_total counted %v new runs, want 1", d)
	}
	if d := after["coalesced"] - before["coalesced"]; d != float64(len(replies)-1) {
		t.Errorf("student_bridge_snapshot_requests_total counted %v coalesced, want %d", d, len(replies)-1)
	}

	// Once the interval passed, a request makes a new snapshot.
	next, err := time.Parse(time.RFC3339Nano, replies[0].NextRun)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(next)) // snapshot.minInterval must pass: the reply said when
	if r := request(""); r.Coalesced || r.Run == replies[0].Run {
		t.Errorf("a request after the interval was answered by the old run: %+v", r)
	}
	waitStream(t, nc, cfg.NATS.Stream.Name, 3*students)
}

// TestSnapshotNotReusedOnceItsFirstEventLeft: within snapshot.minInterval a
// request is answered by the run that ended only while the stream still
// holds that run's first event (docs/consuming.md): a reader from its
// FirstSequence must see every Student. Once the stream dropped it (its
// limits, here a purge), the request makes a new run, even though the
// run's later events are still there.
func TestSnapshotNotReusedOnceItsFirstEventLeft(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "held")
	cfg.Snapshot.RequestSubject = "held-bridge.snapshot"
	cfg.Snapshot.MinInterval = time.Hour
	startBridge(t, cfg)
	nc := natsConn(t)
	const students = 3
	createStudents(t, ns, "s%d", students)
	waitStream(t, nc, cfg.NATS.Stream.Name, students)
	request := func() studentv1.SnapshotReply {
		t.Helper()
		msg, err := nc.Request(cfg.Snapshot.RequestSubject, []byte(`{}`), 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var reply studentv1.SnapshotReply
		if err := json.Unmarshal(msg.Data, &reply); err != nil || reply.Error != "" || reply.Published != students {
			t.Fatalf("reply %s (%v), want %d published", msg.Data, err, students)
		}
		return reply
	}
	first := request()
	waitStream(t, nc, cfg.NATS.Stream.Name, 2*students)
	if again := request(); !again.Coalesced || again.Run != first.Run {
		t.Fatalf("a request within the interval, every event held: %+v, want run %s again", again, first.Run)
	}

	_, stream := openStream(t, nc, cfg.NATS.Stream.Name)
	// Everything up to the run's first event goes; its other events stay.
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(first.FirstSequence+1)); err != nil {
		t.Fatal(err)
	}
	if r := request(); r.Coalesced || r.Run == first.Run {
		t.Errorf("a request once the run's first event (sequence %d) left the stream was answered by that run: %+v", first.FirstSequence, r)
	}
	waitStream(t, nc, cfg.NATS.Stream.Name, 2*students-1)
}
