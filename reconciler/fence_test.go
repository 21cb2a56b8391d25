package reconciler_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/internal/records"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/internal/verify"
	"github.com/student-bridge/student-bridge/reconciler"
	"github.com/student-bridge/student-bridge/sink"
)

// TestPausedOwnerIsFencedBeforeItsEventGoesOut: a replica that is paused
// (a long GC, SIGSTOP, a starved CPU) in the middle of publishing an
// update, while another replica takes the Student over and publishes,
// puts no second event with a used number into the stream when it
// resumes. On a real stream and record bucket, with two reconcilers each
// holding its own records, as two replicas do:
//
//   - paused before its reservation: the reservation's compare-and-set
//     fails, and its event never goes out;
//   - paused after its reservation, before its publish: the new owner
//     finds the update reserved and publishes it as it was, then its own
//     change as the next number; the paused one's copy is dropped by the
//     stream as a duplicate, and its record write conflicts.
//
// Either way the Student's events are one chain that verify accepts.
func TestPausedOwnerIsFencedBeforeItsEventGoesOut(t *testing.T) {
	for _, tc := range []struct {
		pausedBefore string
		want         []string
	}{
		{"reservation", []string{"created 1", "updated 2 (peking)"}},
		{"publish", []string{"created 1", "updated 2 (beijing)", "updated 3 (peking)"}},
	} {
		t.Run("paused before its "+tc.pausedBefore, func(t *testing.T) {
			ctx := context.Background()
			ns := stacktest.Namespace(t, st.Client, "fence")
			nc := stacktest.Connect(t, st.NATS.URL())
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			prefix := "fence" + ns[len("fence-"):]
			streamName, bucketName := "S_"+prefix, "B_"+prefix
			if _, err := natssink.EnsureStream(ctx, js, natssink.StreamConfig{Name: streamName, Subject: prefix + ".>"}, true); err != nil {
				t.Fatal(err)
			}
			kv, err := natssink.EnsureBucket(ctx, nc, natssink.BucketConfig{Name: bucketName, Storage: "file", Replicas: 1}, true)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = js.DeleteStream(context.Background(), streamName)
				_ = js.DeleteKeyValue(context.Background(), bucketName)
			})
			layout, err := natssink.NewSubjectLayout(prefix, "{prefix}.{op}")
			if err != nil {
				t.Fatal(err)
			}
			pub, err := natssink.NewPublisher(nc, natssink.Config{Layout: layout, Stream: streamName})
			if err != nil {
				t.Fatal(err)
			}
			// replica is one bridge: its own records, loaded from the
			// bucket as a replica does when it gains a shard, writing
			// and publishing through g.
			replica := func(g *gate) *reconciler.StudentReconciler {
				recs := records.New()
				if err := recs.Load(ctx, gatedStore{kv, g}); err != nil {
					t.Fatal(err)
				}
				r, err := reconciler.New(reconciler.Deps{Client: st.Client, Sink: gatedSink{pub, g}, Records: recs}, reconciler.Options{Recorder: nopRecorder{}, Cluster: "test"})
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			req := ctrl.Request{NamespacedName: client.ObjectKey{Namespace: ns, Name: "s"}}
			setSchool := func(school string) {
				t.Helper()
				var s studentv1.Student
				if err := st.Client.Get(ctx, req.NamespacedName, &s); err != nil {
					t.Fatal(err)
				}
				s.Spec.School = school
				if err := st.Client.Update(ctx, &s); err != nil {
					t.Fatal(err)
				}
			}

			g := &gate{}
			a := replica(g)
			if err := st.Client.Create(ctx, &studentv1.Student{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s"},
				Spec:       studentv1.StudentSpec{Name: "wang", School: "china"},
			}); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Reconcile(ctx, req); err != nil {
				t.Fatal(err)
			}

			// A sets out to publish an update and is paused.
			setSchool("beijing")
			g.arm(tc.pausedBefore)
			done := make(chan error, 1)
			go func() {
				_, err := a.Reconcile(ctx, req)
				done <- err
			}()
			<-g.reached

			// B takes the Student over and publishes the next change.
			setSchool("peking")
			b := replica(nil)
			if _, err := b.Reconcile(ctx, req); err != nil {
				t.Fatalf("the new owner's reconcile: %v", err)
			}

			// A resumes: refused, then it publishes nothing more.
			close(g.release)
			if err := <-done; !errors.Is(err, sink.ErrConflict) {
				t.Errorf("the paused replica's reconcile after it resumed: %v, want a conflict", err)
			}
			if _, err := a.Reconcile(ctx, req); err != nil {
				t.Errorf("the paused replica's next reconcile: %v", err)
			}

			report, err := verify.Verify(ctx, verify.Source{NATS: nc, Stream: streamName, Bucket: bucketName, Kube: st.Client, Namespaces: []string{ns}, Cluster: "test"}, verify.Options{})
			if err != nil {
				t.Fatal(err)
			}
			state, err := verify.Read(ctx, verify.Source{NATS: nc, Stream: streamName, Kube: st.Client, Namespaces: []string{ns}, Cluster: "test"})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range state.Events {
				s := fmt.Sprintf("%s %d", studentv1.Operation(e.Type), e.Sequence)
				if e.Type == studentv1.EventTypeUpdated {
					s += " (" + e.Data.Spec.School + ")"
				}
				got = append(got, s)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("the stream holds %v, want %v", got, tc.want)
			}
			if len(report.Findings) > 0 {
				t.Errorf("verify: %v", report.Err())
			}
		})
	}
}

// gate pauses a replica at one point of its way (before a record write,
// "reservation", or before a publish, "publish") once armed, until
// release is closed.
type gate struct {
	at      string
	reached chan struct{}
	release chan struct{}
}

func (g *gate) arm(at string) {
	g.at, g.reached, g.release = at, make(chan struct{}), make(chan struct{})
}

// pass pauses the caller if the gate is armed at point.
func (g *gate) pass(point string) {
	if g == nil || g.at != point {
		return
	}
	g.at = ""
	close(g.reached)
	<-g.release
}

type gatedSink struct {
	sink.Sink
	g *gate
}

func (s gatedSink) Publish(ctx context.Context, ev cloudevents.Event) (sink.Receipt, error) {
	s.g.pass("publish")
	return s.Sink.Publish(ctx, ev)
}

type gatedStore struct {
	sink.Store
	g *gate
}

func (s gatedStore) Put(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	s.g.pass("reservation")
	return s.Store.Put(ctx, key, value, revision)
}
