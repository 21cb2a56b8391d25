package natssink_test

// A study for one write per change (docs/guarantees.md, "When a consumer
// can see an event twice"): the record of a Student kept in the events'
// stream under subjects of its own, written with its event in one atomic
// batch (ADR-50). These tests pin down what the server does with such a
// batch; the bridge does not write this way (yet).

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

const (
	studyEvents  = "student.>"
	studyRecords = "student-records.>"
)

// batchAck is the server's answer to a batch's commit.
type batchAck struct {
	Stream string `json:"stream"`
	Seq    uint64 `json:"seq"`
	Batch  string `json:"batch"`
	Count  int    `json:"count"`
	Error  *struct {
		Code    int    `json:"code"`
		ErrCode int    `json:"err_code"`
		Desc    string `json:"description"`
	} `json:"error"`
}

// change is one change of a Student as one batch: its record (fenced by
// the record subject's last sequence, rolled up to the last one, never
// expiring) and its event (with its id for the duplicate window).
type change struct {
	uid, op, eventID string
	lastRecordSeq    uint64 // 0: the Student has no record yet
}

// commit sends c as an atomic batch and waits for the commit's ack: the
// first message goes without waiting, so a change is one round trip.
func commit(t *testing.T, nc *nats.Conn, c change) (batchAck, error) {
	t.Helper()
	id := rand.Text()
	rec := nats.NewMsg("student-records." + c.uid)
	rec.Header.Set("Nats-Batch-Id", id)
	rec.Header.Set("Nats-Batch-Sequence", "1")
	rec.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(c.lastRecordSeq, 10))
	rec.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	rec.Header.Set(jetstream.MsgTTLHeader, "never")
	rec.Data = []byte(fmt.Sprintf(`{"uid":%q,"published":{"id":%q,"type":%q}}`, c.uid, c.eventID, c.op))
	if err := nc.PublishMsg(rec); err != nil {
		t.Fatal(err)
	}
	ev := nats.NewMsg("student." + c.op)
	ev.Header.Set("Nats-Batch-Id", id)
	ev.Header.Set("Nats-Batch-Sequence", "2")
	ev.Header.Set("Nats-Batch-Commit", "1")
	ev.Header.Set(jetstream.MsgIDHeader, c.eventID)
	ev.Data = []byte(fmt.Sprintf(`{"id":%q,"subject":%q}`, c.eventID, c.uid))
	resp, err := nc.RequestMsg(ev, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var ack batchAck
	if err := json.Unmarshal(resp.Data, &ack); err != nil {
		t.Fatalf("batch ack %s: %v", resp.Data, err)
	}
	if ack.Error != nil {
		return ack, fmt.Errorf("%d/%d: %s", ack.Error.Code, ack.Error.ErrCode, ack.Error.Desc)
	}
	return ack, nil
}

// TestStudyOneBatchPerChange: what a stream holding events and records
// does with a change written as one atomic batch, on one server and on a
// three-node cluster with three replicas.
func TestStudyOneBatchPerChange(t *testing.T) {
	t.Run("one server", func(t *testing.T) { studyOneBatch(t, stacktest.NATS(t), 1) })
	t.Run("three-node cluster", func(t *testing.T) {
		c, err := stack.StartNATSCluster(3, stack.NATSClusterOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Stop)
		if err := c.WaitReady(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		studyOneBatch(t, stacktest.Connect(t, c.URL()), 3)
	})
}

func studyOneBatch(t *testing.T, nc *nats.Conn, replicas int) {
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const maxAge = 2 * time.Second
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "STUDY", Subjects: []string{studyEvents, studyRecords}, Replicas: replicas,
		AllowAtomicPublish: true, AllowMsgTTL: true, AllowRollup: true, AllowDirect: true,
		MaxAge: maxAge, Duplicates: time.Second,
	})
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

	// A create: the record and the event, stored together, one ack.
	created, err := commit(t, nc, change{uid: "u1", op: "created", eventID: "e1"})
	if err != nil || created.Count != 2 {
		t.Fatalf("a create as one batch: %+v, %v", created, err)
	}
	// An update, fenced by the record's sequence: the record rolls up to
	// the last one.
	updated, err := commit(t, nc, change{uid: "u1", op: "updated", eventID: "e2", lastRecordSeq: created.Seq - 1})
	if err != nil {
		t.Fatalf("an update fenced by the record's sequence %d: %v", created.Seq-1, err)
	}
	if n := msgs(); n != 3 {
		t.Errorf("after a create and an update the stream holds %d messages, want 3 (two events, the last record)", n)
	}

	// A replica that lost the Student (a stale fence): the whole batch is
	// refused, its event is not stored.
	if _, err := commit(t, nc, change{uid: "u1", op: "updated", eventID: "e3", lastRecordSeq: created.Seq - 1}); err == nil {
		t.Error("a batch with a stale fence was committed")
	}
	// The same change again (a retry whose ack was lost): refused whole.
	if _, err := commit(t, nc, change{uid: "u1", op: "updated", eventID: "e2", lastRecordSeq: updated.Seq - 1}); err == nil {
		t.Error("a batch with an event id the stream holds was committed")
	}
	if n := msgs(); n != 3 {
		t.Errorf("after two refused batches the stream holds %d messages, want 3", n)
	}

	// A consumer of the events reads no record.
	events, err := js.OrderedConsumer(ctx, "STUDY", jetstream.OrderedConsumerConfig{FilterSubjects: []string{studyEvents}})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := events.FetchNoWait(10)
	if err != nil {
		t.Fatal(err)
	}
	var read []string
	for m := range batch.Messages() {
		read = append(read, m.Subject())
	}
	if fmt.Sprint(read) != "[student.created student.updated]" {
		t.Errorf("a consumer of %s read %v", studyEvents, read)
	}

	// Past maxAge the events are gone and the record stays: what a start
	// loads, by the last message of each record subject.
	time.Sleep(maxAge + time.Second)
	rec, err := stream.GetLastMsgForSubject(ctx, "student-records.u1")
	if err != nil {
		t.Fatalf("the record past maxAge: %v", err)
	}
	if string(rec.Data) != `{"uid":"u1","published":{"id":"e2","type":"updated"}}` {
		t.Errorf("the record past maxAge is %s", rec.Data)
	}
	if n := msgs(); n != 1 {
		t.Errorf("past maxAge the stream holds %d messages, want 1 (the record)", n)
	}
	// The fence goes on from the record that outlived the events.
	if _, err := commit(t, nc, change{uid: "u1", op: "deleted", eventID: "e4", lastRecordSeq: rec.Sequence}); err != nil {
		t.Errorf("a change after the events expired: %v", err)
	}
}
