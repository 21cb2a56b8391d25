//go:build !nostack

package consumer

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/nats-io/nats.go/jetstream"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// TestRebuildReadsOnAfterLosingItsConsumer: the consumer a rebuild reads
// through goes away after ten events (as when the server it was placed
// on stops answering), with most of the stream still to read. The rebuild
// reads on from the eleventh event through a new one: every event once,
// in stream order.
func TestRebuildReadsOnAfterLosingItsConsumer(t *testing.T) {
	ctx := context.Background()
	m, err := NewMirror(stacktest.NATS(t), MirrorOptions{Service: "roster", Handler: func(context.Context, Change) error { return nil },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := m.js.CreateStream(ctx, jetstream.StreamConfig{Name: m.o.Stream, Subjects: []string{"student.>"}})
	if err != nil {
		t.Fatal(err)
	}
	// More events than a pull brings at once (500), so that the reading
	// has to ask the lost consumer for more.
	const total = 2000
	for i := 1; i <= total; i++ {
		ev := cloudevents.NewEvent()
		ev.SetID(fmt.Sprintf("e%d", i))
		ev.SetSource("/student-bridge/default")
		ev.SetType(studentv1.EventTypeUpdated)
		if err := ev.SetData(cloudevents.ApplicationJSON, map[string]any{"metadata": map[string]any{"uid": fmt.Sprintf("u%d", i%7), "name": "s"}}); err != nil {
			t.Fatal(err)
		}
		msg, err := natssink.EncodeMsg(ctx, ev, "student.default.updated", natssink.Structured)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.js.PublishMsgAsync(msg); err != nil {
			t.Fatal(err)
		}
	}
	<-m.js.PublishAsyncComplete()

	var read []uint64
	err = m.fold(ctx, stream, total, func(d *Desired, _ *event) {
		if len(read) == 10 {
			if err := stream.DeleteConsumer(ctx, rebuildConsumer(m.o.Service)); err != nil {
				t.Errorf("delete the rebuild's consumer: %v", err)
			}
		}
		read = append(read, d.Sequence)
	})
	if err != nil {
		t.Fatalf("the rebuild failed once its consumer was lost: %v", err)
	}
	if len(read) != total {
		t.Fatalf("the rebuild read %d events of %d", len(read), total)
	}
	for i, seq := range read {
		if seq != uint64(i+1) {
			t.Fatalf("event %d of the rebuild is stream sequence %d", i+1, seq)
		}
	}
}
