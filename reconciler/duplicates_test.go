package reconciler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/nats-io/nats.go/jetstream"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/internal/records"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/sink"
)

// TestCrashBeforeTheRecordRepublishes: the one way a consumer gets an
// event twice (docs/guarantees.md, "When a consumer can see an event
// twice"). A bridge publishes an update, the stream acks it, and the bridge
// stops before its record is written (here: the record store fails, and
// the records in memory go with the process). The next bridge finds the
// update reserved in its record and publishes it again as it was, with
// the same id: within the stream's duplicate window the stream drops the
// copy; after it, the stream holds the event twice.
//
// With the records in the events' stream (records.store: stream) the
// event and its record are one write: a bridge that stops right after it
// (here: the commit's answer is lost) leaves the record with the event,
// and the next bridge publishes nothing again, within the window or after.
func TestCrashBeforeTheRecordRepublishes(t *testing.T) {
	for _, tc := range []struct {
		name            string
		oneWrite        bool
		window, downFor time.Duration
		want            int
	}{
		{"restarted within the duplicate window", false, time.Minute, 0, 1},
		{"restarted after it", false, time.Second, 1500 * time.Millisecond, 2},
		{"one write, restarted within the duplicate window", true, time.Minute, 0, 1},
		{"one write, restarted after it", true, time.Second, 1500 * time.Millisecond, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			f := newFixture(t, false)
			nc := stacktest.Connect(t, st.NATS.URL())
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			prefix := "dup" + f.ns[len("rec-"):]
			cfg := natssink.StreamConfig{Name: "S_" + prefix, Subject: prefix + ".>", Duplicates: tc.window}
			if tc.oneWrite {
				cfg.Records = natssink.RecordsSubject(prefix)
			}
			if _, err := natssink.EnsureStream(ctx, js, cfg, true); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = js.DeleteStream(ctx, cfg.Name) })
			layout, err := natssink.NewSubjectLayout(prefix, "{prefix}.{op}")
			if err != nil {
				t.Fatal(err)
			}
			pub, err := natssink.NewPublisher(nc, natssink.Config{Layout: layout, Stream: cfg.Name})
			if err != nil {
				t.Fatal(err)
			}
			acks := &ackHook{Sink: pub}
			f.deps.Sink = acks
			inStream, err := natssink.NewStreamRecords(pub, cfg.Name, prefix, nil)
			if err != nil {
				t.Fatal(err)
			}
			crashing := &stopsAfterCommit{StreamRecords: inStream}
			restart := func() {
				f.deps.Records = records.New()
				f.build()
				if !tc.oneWrite {
					f.load()
				} else if err := f.deps.Records.Load(ctx, crashing); err != nil {
					t.Fatal(err)
				}
			}
			restart()

			f.create("once", nil)
			f.mustReconcile("once")
			f.update("once", func(s *studentv1.Student) { s.Spec.School = "beijing" })
			// The bridge stops once the update is acknowledged: its
			// reservation is written, its record after the ack is not.
			acks.after = func() { f.store.Fail(errors.New("the bridge stopped")) }
			crashing.stop = true
			if err := f.reconcile("once"); err == nil {
				t.Fatal("the update went out and the bridge did not stop")
			}
			acks.after = nil
			// The next bridge: the records as the store holds them.
			time.Sleep(tc.downFor) // the time the bridge is down is what the case varies
			f.store.Fail(nil)
			crashing.stop = false
			restart()
			f.mustReconcile("once")

			info, err := js.Stream(ctx, cfg.Name)
			if err != nil {
				t.Fatal(err)
			}
			state, err := info.Info(ctx, jetstream.WithSubjectFilter(prefix+".updated"))
			if err != nil {
				t.Fatal(err)
			}
			if got := int(state.State.Subjects[prefix+".updated"]); got != tc.want {
				t.Errorf("the stream holds the update %d times, want %d", got, tc.want)
			}
		})
	}
}

// stopsAfterCommit is the record store in the events' stream of a bridge
// that stops once a commit is stored, before it hears the answer, or
// before a record written on its own.
type stopsAfterCommit struct {
	*natssink.StreamRecords
	stop bool
}

func (s *stopsAfterCommit) Put(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	if s.stop {
		return 0, errors.New("the bridge stopped")
	}
	return s.StreamRecords.Put(ctx, key, value, revision)
}

func (s *stopsAfterCommit) Commit(ctx context.Context, ev cloudevents.Event, key string, value []byte, revision uint64) (sink.Receipt, uint64, error) {
	receipt, rev, err := s.StreamRecords.Commit(ctx, ev, key, value, revision)
	if err == nil && s.stop {
		return sink.Receipt{}, 0, errors.New("the bridge stopped")
	}
	return receipt, rev, err
}

// ackHook is a sink that calls after, if set, once an event it publishes
// is acknowledged.
type ackHook struct {
	sink.Sink
	after func()
}

func (a *ackHook) Publish(ctx context.Context, ev cloudevents.Event) (sink.Receipt, error) {
	receipt, err := a.Sink.Publish(ctx, ev)
	if err == nil && a.after != nil {
		a.after()
	}
	return receipt, err
}
