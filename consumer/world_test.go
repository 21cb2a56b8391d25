//go:build !nostack

package consumer_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// server is the embedded NATS server (JetStream) the package's tests share.
// A consumer needs no API server: the events it reads are made here by the
// contract package, as the bridge makes them.
var server *stack.NATS

func TestMain(m *testing.M) {
	var err error
	if server, err = stack.StartNATS(stack.NATSOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, "start NATS:", err)
		os.Exit(1)
	}
	code := m.Run()
	server.Stop()
	os.Exit(code)
}

// world plays what a bridge publishes about one namespace of Students,
// by the contract alone: each change is an event made by api/contract
// (its id, sequence and previous id), published by the bridge's own
// publisher (internal/natssink) to a stream of the world's own, and recorded
// in a record store; snapshot requests are answered with snapshot events
// and a reply as docs/contract.md describes them. The world's Students are
// the desired state a service must end with.
type world struct {
	ns  string
	cfg *config.Config // the stream, subjects, buckets and snapshot subject
	nc  *nats.Conn
	pub *natssink.Publisher
	kv  jetstream.KeyValue // the record store

	mu       sync.Mutex
	students map[types.UID]*studentv1.Student
	last     map[types.UID]*studentv1.PublishedEvent
	version  int
	runs     int
}

// worldOptions change a world's stream before it is created.
type worldOptions struct {
	maxMsgs int64
}

func newWorld(t *testing.T, prefix string) *world {
	t.Helper()
	return newWorldWith(t, prefix, worldOptions{})
}

// worlds numbers the worlds, so that each has a stream, subjects and
// buckets of its own names (-count=2 makes every world twice).
var worlds atomic.Int64

func newWorldWith(t *testing.T, prefix string, o worldOptions) *world {
	t.Helper()
	ctx := context.Background()
	prefix = fmt.Sprintf("%s%d", prefix, worlds.Add(1))
	cfg, err := config.NewLoader(nil, config.BridgeCommand).Load("")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Cluster = "test"
	cfg.NATS.SubjectPrefix = prefix
	cfg.NATS.Stream.Name = "S_" + prefix
	cfg.NATS.Stream.MaxMsgs = o.maxMsgs
	cfg.Records.Bucket = "R_" + prefix
	cfg.Receipts.Bucket = "RC_" + prefix
	cfg.Snapshot.RequestSubject = "snapshot." + prefix
	nc := stacktest.Connect(t, server.URL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	layout, err := natssink.NewSubjectLayout(prefix, cfg.NATS.SubjectLayout)
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.NATS.Stream
	if _, err := natssink.EnsureStream(ctx, js, natssink.StreamConfig{Name: s.Name, Subject: layout.StreamSubject(), Storage: s.Storage,
		Replicas: s.Replicas, MaxMsgs: s.MaxMsgs, Discard: s.Discard, Duplicates: s.Duplicates}, true); err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: cfg.Records.Bucket})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: cfg.Receipts.Bucket}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, del := range []func() error{
			func() error { return js.DeleteStream(ctx, s.Name) },
			func() error { return js.DeleteKeyValue(ctx, cfg.Records.Bucket) },
			func() error { return js.DeleteKeyValue(ctx, cfg.Receipts.Bucket) },
		} {
			if err := del(); err != nil {
				t.Errorf("remove the world's stream and buckets: %v", err)
			}
		}
	})
	pub, err := natssink.NewPublisher(nc, natssink.Config{Layout: layout, Stream: s.Name})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{ns: prefix, cfg: cfg, nc: nc, pub: pub, kv: kv,
		students: map[types.UID]*studentv1.Student{}, last: map[types.UID]*studentv1.PublishedEvent{}}
	sub, err := nc.Subscribe(cfg.Snapshot.RequestSubject, w.answerSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return w
}

// create adds a Student and publishes its created event.
func (w *world) create(t *testing.T, name, school string) *studentv1.Student {
	t.Helper()
	s := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name, UID: uuid.NewUUID(), Generation: 1},
		Spec: studentv1.StudentSpec{Name: name, School: school}}
	w.publish(t, studentv1.EventTypeCreated, s)
	return s.DeepCopy()
}

// update changes a Student's school and publishes its updated event.
func (w *world) update(t *testing.T, s *studentv1.Student, school string) {
	t.Helper()
	w.mu.Lock()
	cur := w.students[s.UID].DeepCopy()
	w.mu.Unlock()
	cur.Spec.School = school
	cur.Generation++
	w.publish(t, studentv1.EventTypeUpdated, cur)
}

// remove deletes a Student and publishes its deleted event.
func (w *world) remove(t *testing.T, s *studentv1.Student) {
	t.Helper()
	w.mu.Lock()
	cur := w.students[s.UID].DeepCopy()
	w.mu.Unlock()
	w.publish(t, studentv1.EventTypeDeleted, cur)
}

// publish publishes the event of eventType for s, as the bridge does, and
// then records it: the record, the Student as the world holds it.
func (w *world) publish(t *testing.T, eventType string, s *studentv1.Student) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.version++
	s.ResourceVersion = strconv.Itoa(w.version)
	last := w.last[s.UID]
	previousID := ""
	if last != nil {
		previousID = last.ID
	}
	id := contract.EventID(eventType, s, previousID)
	ev, err := contract.NewEvent(w.cfg.Cluster, eventType, id, s, last, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sequence := contract.Sequence(eventType, last)
	contract.Chain(&ev, sequence, previousID)
	receipt, err := w.pub.Publish(context.Background(), ev)
	if err != nil {
		t.Fatalf("publish %s of %s: %v", eventType, s.Name, err)
	}
	published := &studentv1.PublishedEvent{Type: eventType, ID: id, Time: metav1.NewTime(ev.Time().Truncate(time.Second)),
		Generation: s.Generation, Sequence: int64(receipt.Sequence), StudentSequence: sequence, Spec: s.Spec, Labels: s.Labels}
	key := contract.RecordKey(s.UID)
	if eventType == studentv1.EventTypeDeleted {
		delete(w.students, s.UID)
		delete(w.last, s.UID)
		if err := w.kv.Delete(context.Background(), key); err != nil {
			t.Fatal(err)
		}
		return
	}
	w.students[s.UID], w.last[s.UID] = s.DeepCopy(), published
	b, err := json.Marshal(studentv1.StudentRecord{Namespace: s.Namespace, Name: s.Name, UID: s.UID, Published: *published})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.kv.Put(context.Background(), key, b); err != nil {
		t.Fatal(err)
	}
}

// answerSnapshot publishes a snapshot event of every Student of the
// request's namespace (all when empty), each carrying its Student's last
// sequence and event id, and replies once they are stored.
func (w *world) answerSnapshot(msg *nats.Msg) {
	reply := studentv1.SnapshotReply{Cluster: w.cfg.Cluster}
	defer func() {
		b, _ := json.Marshal(reply)
		_ = msg.Respond(b)
	}()
	req, err := studentv1.ParseSnapshotRequest(msg.Data)
	if err != nil {
		reply.Error = err.Error()
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.runs++
	reply.Run = strconv.Itoa(w.runs)
	for uid, s := range w.students {
		if req.Namespace != "" && s.Namespace != req.Namespace {
			continue
		}
		h := sha256.Sum256([]byte(string(uid) + "\x00snapshot\x00" + s.ResourceVersion + "\x00" + reply.Run))
		ev, err := contract.NewEvent(w.cfg.Cluster, studentv1.EventTypeSnapshot, hex.EncodeToString(h[:16]), s, nil, time.Now())
		if err != nil {
			reply.Error = err.Error()
			return
		}
		last := w.last[uid]
		contract.Chain(&ev, contract.Sequence(studentv1.EventTypeSnapshot, last), last.ID)
		receipt, err := w.pub.Publish(context.Background(), ev)
		if err != nil {
			reply.Error = err.Error()
			return
		}
		if reply.FirstSequence == 0 || receipt.Sequence < reply.FirstSequence {
			reply.FirstSequence = receipt.Sequence
		}
		reply.Published++
	}
	reply.Ended = time.Now().UTC().Format(time.RFC3339)
}

// lastID is the id of the last event published for s.
func (w *world) lastID(s *studentv1.Student) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last[s.UID].ID
}

// state is the world's Students: uid -> "name=school".
func (w *world) state() map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]string{}
	for uid, s := range w.students {
		out[string(uid)] = s.Name + "=" + s.Spec.School
	}
	return out
}
