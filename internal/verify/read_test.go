package verify

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// lossyProgress deletes every consumer of the stream the first time the
// reading reports progress: the reading's consumer is gone halfway, as
// when the server it was placed on stops answering.
type lossyProgress struct {
	t      *testing.T
	stream jetstream.Stream
	once   sync.Once
}

func (p *lossyProgress) Write(b []byte) (int, error) {
	p.once.Do(func() {
		ctx := context.Background()
		names := p.stream.ConsumerNames(ctx)
		n := 0
		for name := range names.Name() {
			if err := p.stream.DeleteConsumer(ctx, name); err != nil {
				p.t.Errorf("delete consumer %s: %v", name, err)
			}
			n++
		}
		if n == 0 {
			p.t.Error("the reading has no consumer to lose")
		}
	})
	return len(b), nil
}

// TestReadStreamSurvivesALostConsumer: a reading whose consumer goes away
// halfway reads on from where it was, every message once.
func TestReadStreamSurvivesALostConsumer(t *testing.T) {
	nc := stacktest.NATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "STUDENTS", Subjects: []string{"student.>"}})
	if err != nil {
		t.Fatal(err)
	}
	// Not Student CloudEvents: each one read counts as unreadable.
	const total = 2*ProgressEvery + 7
	for i := range total {
		if _, err := js.PublishAsync("student.x", fmt.Appendf(nil, "message %d", i)); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 999 { // within the client's bound on what is in flight
			<-js.PublishAsyncComplete()
		}
	}
	<-js.PublishAsyncComplete()

	var st State
	err = readStream(ctx, Source{NATS: nc, Stream: "STUDENTS", Progress: &lossyProgress{t: t, stream: stream}}, &st)
	if err != nil {
		t.Fatalf("the reading failed once its consumer was lost: %v", err)
	}
	if len(st.Unreadable) != total || st.LastSequence != total {
		t.Fatalf("read %d messages of %d (last sequence %d)", len(st.Unreadable), total, st.LastSequence)
	}
}
