//go:build !nostack

package natssink_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/sink"
)

// TestStreamRecordsCommitEventAndRecordTogether: records kept in the
// events' stream (records.store: stream), on one server and on a
// three-node cluster with three replicas. A change is one atomic batch:
// the event and its record are stored together or not at all; a stale
// fence or an event id the stream holds refuses the whole batch (as a
// conflict: read the record again); a consumer of the events reads no
// record; past the stream's max age the events are gone and the records
// stay, loaded last per subject, and the fence goes on from them.
func TestStreamRecordsCommitEventAndRecordTogether(t *testing.T) {
	t.Run("one server", func(t *testing.T) { commitTogether(t, stacktest.NATS(t), 1) })
	t.Run("three-node cluster", func(t *testing.T) {
		c, err := stack.StartNATSCluster(3, stack.NATSClusterOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Stop)
		if err := c.WaitReady(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		commitTogether(t, stacktest.Connect(t, c.URL()), 3)
	})
}

func commitTogether(t *testing.T, nc *nats.Conn, replicas int) {
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const maxAge = 2 * time.Second
	cfg := natssink.StreamConfig{Name: "ONEWRITE", Subject: "student.>", Storage: "file", Replicas: replicas,
		MaxAge: maxAge, Duplicates: time.Second, Records: natssink.RecordsSubject("student")}
	info, err := natssink.EnsureStream(ctx, js, cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), cfg.Name) })
	if _, err := natssink.EnsureStream(ctx, js, cfg, false); err != nil {
		t.Errorf("the stream it made is refused: %v", err)
	}
	if len(info.Config.Subjects) != 2 {
		t.Fatalf("the stream captures %v", info.Config.Subjects)
	}
	stream, err := js.Stream(ctx, cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	layout, err := natssink.NewSubjectLayout("student", "{prefix}.{op}")
	if err != nil {
		t.Fatal(err)
	}
	p, err := natssink.NewPublisher(nc, natssink.Config{Layout: layout, Stream: cfg.Name})
	if err != nil {
		t.Fatal(err)
	}
	store, err := natssink.NewStreamRecords(p, cfg.Name, "student", nil)
	if err != nil {
		t.Fatal(err)
	}
	msgs := func() uint64 {
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	event := func(id, op string) cloudevents.Event {
		ev := cloudevents.NewEvent()
		ev.SetID(id)
		ev.SetType("io.k8s.example.student." + op)
		ev.SetSource("/test")
		return ev
	}

	// A create: the event and the record, one ack. A cluster's new stream
	// has no responder for its subjects on every server at once (its
	// leader's interest spreads over the routes): the bridge retries what
	// is unavailable, and so does the test, for a while.
	var created sink.Receipt
	var rev uint64
	_ = stacktest.Eventually(10*time.Second, func() error {
		created, rev, err = store.Commit(ctx, event("e1", "created"), "u1", []byte("r1"), 0)
		if errors.Is(err, sink.ErrUnavailable) {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatalf("a create as one batch: %v", err)
	}
	if created.Subject != "student.created" || rev != created.Sequence+1 {
		t.Errorf("receipt %+v, record revision %d: want the event on student.created and the record right after it", created, rev)
	}
	// An update, fenced by the record's revision: the record rolls up.
	updated, rev2, err := store.Commit(ctx, event("e2", "updated"), "u1", []byte("r2"), rev)
	if err != nil {
		t.Fatalf("an update fenced by revision %d: %v", rev, err)
	}
	if n := msgs(); n != 3 {
		t.Errorf("after a create and an update the stream holds %d messages, want 3 (two events, the last record)", n)
	}
	// A stale fence (a replica that lost the Student), and the same change
	// again (a retry whose ack was lost): refused whole, as conflicts.
	if _, _, err := store.Commit(ctx, event("e3", "updated"), "u1", []byte("r3"), rev); !errors.Is(err, sink.ErrConflict) {
		t.Errorf("a batch with a stale fence: %v, want a conflict", err)
	}
	if _, _, err := store.Commit(ctx, event("e2", "updated"), "u1", []byte("r2"), rev2); !errors.Is(err, sink.ErrConflict) {
		t.Errorf("a batch with an event id the stream holds: %v, want a conflict", err)
	}
	if n := msgs(); n != 3 {
		t.Errorf("after two refused batches the stream holds %d messages, want 3", n)
	}
	got, err := store.Get(ctx, "u1")
	if err != nil || string(got.Value) != "r2" || got.Revision != rev2 || got.EventSequence != updated.Sequence {
		t.Errorf("Get = %+v, %v; want r2 at revision %d, its event at %d", got, err, rev2, updated.Sequence)
	}
	// A record written alone (the shard count, say) and one removed.
	if _, err := store.Put(ctx, "config.shards", []byte("16"), 0); err != nil {
		t.Fatal(err)
	}
	_, rev3, err := store.Commit(ctx, event("e4", "created"), "u2", []byte("gone"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Delete(ctx, "u2", rev3); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Get(ctx, "u2"); !errors.Is(err, sink.ErrNotFound) {
		t.Errorf("a removed record: %v, want not found", err)
	}

	// A consumer of the events reads no record. Records sit between the
	// events: had the consumer read them, they would be among the first
	// three. On a cluster a consumer just made may answer its first pull
	// with nothing: read again with a new one until three arrive.
	var read []string
	if err := stacktest.Eventually(10*time.Second, func() error {
		events, err := js.OrderedConsumer(ctx, cfg.Name, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"student.>"}})
		if err != nil {
			return err
		}
		batch, err := events.Fetch(3, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return err
		}
		read = read[:0]
		for m := range batch.Messages() {
			read = append(read, m.Subject())
		}
		if len(read) < 3 {
			return fmt.Errorf("read %v (%v)", read, batch.Error())
		}
		return nil
	}); err != nil {
		t.Fatalf("a consumer of student.>: %v", err)
	}
	if fmt.Sprint(read) != "[student.created student.updated student.created]" {
		t.Errorf("a consumer of student.> read %v", read)
	}

	// Past max age the events are gone, and so is the removed record's
	// marker; the records stay.
	time.Sleep(maxAge + time.Second) // the age must pass for the records to outlive it
	if n := msgs(); n != 2 {
		t.Errorf("past max age the stream holds %d messages, want 2 (the records)", n)
	}
	all, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	loaded := map[string]string{}
	for _, r := range all {
		loaded[r.Key] = string(r.Value)
	}
	if fmt.Sprint(loaded) != "map[config.shards:16 u1:r2]" {
		t.Errorf("loaded %v", loaded)
	}
	if _, _, err := store.Commit(ctx, event("e5", "deleted"), "u1", []byte("r5"), rev2); err != nil {
		t.Errorf("a change after the events expired: %v", err)
	}
}

// TestStreamRecordsRefuseAStreamWithoutBatches: an existing stream that
// does not allow atomic batches (or TTLs, or rollups) cannot keep the
// records; the bridge never changes it and says why.
func TestStreamRecordsRefuseAStreamWithoutBatches(t *testing.T) {
	ctx := context.Background()
	js, err := jetstream.New(stacktest.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PLAIN", Subjects: []string{"student.>", "student-records.>"}}); err != nil {
		t.Fatal(err)
	}
	_, err = natssink.EnsureStream(ctx, js, natssink.StreamConfig{Name: "PLAIN", Subject: "student.>", Records: "student-records"}, true)
	if !errors.Is(err, natssink.ErrStreamConflict) {
		t.Errorf("a stream without atomic batches: %v, want a conflict", err)
	}
}
