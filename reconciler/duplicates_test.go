package reconciler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/reconciler/records"
	"github.com/student-bridge/student-bridge/sink/natssink"
)

// TestCrashBeforeTheRecordRepublishes: the one way a consumer gets an
// event twice (docs/guarantees.md, "Duplicates are bounded"). A bridge
// publishes an update, the stream acks it, and the bridge stops before
// its record is written (here: the record store fails, and the records in
// memory go with the process). The next bridge publishes the change again
// with the same id: within the stream's duplicate window the stream drops
// the copy; after it, the stream holds the event twice.
func TestCrashBeforeTheRecordRepublishes(t *testing.T) {
	for _, tc := range []struct {
		name            string
		window, downFor time.Duration
		want            int
	}{
		{"restarted within the duplicate window", time.Minute, 0, 1},
		{"restarted after it", time.Second, 1500 * time.Millisecond, 2},
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
			stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S_" + prefix, Subjects: []string{prefix + ".>"}, Duplicates: tc.window})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = js.DeleteStream(ctx, "S_"+prefix) })
			layout, err := natssink.NewSubjectLayout(prefix, "{prefix}.{op}")
			if err != nil {
				t.Fatal(err)
			}
			if f.r.Sink, err = natssink.NewPublisher(nc, natssink.Config{Layout: layout, Stream: "S_" + prefix}); err != nil {
				t.Fatal(err)
			}

			f.create("once", nil)
			f.mustReconcile("once")
			f.update("once", func(s *studentv1.Student) { s.Spec.School = "beijing" })
			f.store.Fail(errors.New("the bridge stopped"))
			if err := f.reconcile("once"); err == nil {
				t.Fatal("the update's record was written: no crash between the ack and the record")
			}
			// The next bridge: the records as the store holds them.
			time.Sleep(tc.downFor)
			f.store.Fail(nil)
			f.r.Records = records.New()
			f.load()
			f.mustReconcile("once")

			info, err := stream.Info(ctx, jetstream.WithSubjectFilter(prefix+".updated"))
			if err != nil {
				t.Fatal(err)
			}
			if got := int(info.State.Subjects[prefix+".updated"]); got != tc.want {
				t.Errorf("the stream holds the update %d times, want %d", got, tc.want)
			}
		})
	}
}
