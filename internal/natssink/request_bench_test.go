//go:build !nostack

package natssink_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/internal/runstat"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

func TestMain(m *testing.M) { os.Exit(stacktest.RunWithoutStack(m)) }

// BenchmarkRequest is one of the three JetStream requests a change makes
// (the reservation, the publish, the record): a message published to a
// stream (file storage, as deployed) and its ack awaited, through the
// requests the publisher and the record store send. The NATS server runs
// in a process of its own, so that cpu-ns/op (the process's CPU time)
// and ctxsw/op (its threads' context switches) are the client's alone:
// the goroutines a request and its answer pass through show there.
// "apart" is the time between two requests: none, or 10ms (about the
// bridge's at 30 changes a second, when its threads park in between).
func BenchmarkRequest(b *testing.B) {
	ctx := context.Background()
	nc := stacktest.Connect(b, stacktest.NATSProcess(b))
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	cfg := natssink.StreamConfig{Name: "BENCH", Subject: "bench.>", Storage: "file", Replicas: 1, Duplicates: time.Minute}
	if _, err := natssink.EnsureStream(ctx, js, cfg, true); err != nil {
		b.Fatal(err)
	}
	rs := natssink.NewRequests(nc)
	data := make([]byte, 600) // about a change's CloudEvent
	for _, apart := range []time.Duration{0, 10 * time.Millisecond} {
		b.Run(fmt.Sprintf("apart=%s", apart), func(b *testing.B) {
			m := &nats.Msg{Subject: "bench.updated", Data: data}
			spent := runstat.Take()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if apart > 0 {
					time.Sleep(apart)
				}
				answer, err := rs.Do(ctx, m, 10*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				if len(answer.Data) == 0 {
					b.Fatal("an empty ack")
				}
			}
			b.StopTimer()
			runstat.Report(b, spent)
		})
	}
}
