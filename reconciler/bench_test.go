package reconciler_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/internal/records"
	"github.com/student-bridge/student-bridge/internal/runstat"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/internal/stages"
	"github.com/student-bridge/student-bridge/internal/tracing"
	"github.com/student-bridge/student-bridge/reconciler"
)

// BenchmarkOneChange is the path one change of a Student takes through the
// reconciler as the bridge runs it: the Student read from the cache, its
// event reserved in the record store, published to JetStream and
// acknowledged, and its record written after the ack. The stream and the
// bucket are on a real NATS server (file storage, as deployed); the cache
// is the Student in memory, as the informer's cache serves it (a map
// lookup and a deep copy), so the API server's watch is not in the
// figure. Each iteration is one update of the Student's spec.
//
// Besides ns, B and allocs per change it reports each stage's mean time
// per change (the stage histograms the bridge exports) and, per change,
// the process's CPU time (cpu-ns: on a busy machine steadier than the
// time a change takes), the goroutines started and its context switches
// (the kernel's count of its threads': a goroutine hand-off that parks a
// thread and wakes another shows there). The NATS server runs in a
// process of its own, as deployed: the allocations, CPU time and context
// switches are the bridge's alone.
func BenchmarkOneChange(b *testing.B) {
	ctx := context.Background()
	// Traces as the bridge sets them up, going nowhere here.
	b.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	provider := otel.GetTracerProvider()
	if _, err := tracing.Setup(ctx, "bench"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { otel.SetTracerProvider(provider) })
	ns := stacktest.Namespace(b, st.Client, "bench")
	nc := stacktest.Connect(b, stacktest.NATSProcess(b))
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	prefix := "bench" + ns[len("bench-"):]
	cfg := natssink.StreamConfig{Name: "S_" + prefix, Subject: prefix + ".>", Duplicates: 2 * time.Minute, Storage: "file", Replicas: 1}
	if _, err := natssink.EnsureStream(ctx, js, cfg, true); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = js.DeleteStream(ctx, cfg.Name) })
	layout, err := natssink.NewSubjectLayout(prefix, "{prefix}.{op}")
	if err != nil {
		b.Fatal(err)
	}
	pub, err := natssink.NewPublisher(nc, natssink.Config{Layout: layout, Stream: cfg.Name})
	if err != nil {
		b.Fatal(err)
	}
	bucket := "R_" + prefix
	store, err := natssink.EnsureBucket(ctx, nc, natssink.BucketConfig{Name: bucket, Storage: "file", Replicas: 1}, true)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = js.DeleteKeyValue(ctx, bucket) })
	recs := records.New()
	if err := recs.Load(ctx, store); err != nil {
		b.Fatal(err)
	}

	stu := &studentv1.Student{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "wang", Finalizers: []string{studentv1.Finalizer}},
		Spec:       studentv1.StudentSpec{Name: "wang", School: "china"},
	}
	if err := st.Client.Create(ctx, stu); err != nil {
		b.Fatal(err)
	}
	cache := &memCache{Client: st.Client, s: stu}
	r, err := reconciler.New(reconciler.Deps{Client: cache, Sink: pub, Records: recs},
		reconciler.Options{HoldWithFinalizer: true, Recorder: nopRecorder{}, Cluster: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: stu.Name}}
	change := func(i int) {
		cache.mu.Lock()
		cache.s.Generation++
		cache.s.Spec.School = fmt.Sprint("school ", i)
		cache.mu.Unlock()
		if _, err := r.Reconcile(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	change(0) // the created event: every iteration is an update

	steps := []string{stages.WriteAhead, stages.Publish, stages.Record}
	stagesBefore := stageSums(b, steps)
	spent := runstat.Take()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		change(i + 1)
	}
	b.StopTimer()
	runstat.Report(b, spent)
	n := float64(b.N)
	after := stageSums(b, steps)
	for _, s := range steps {
		b.ReportMetric((after[s]-stagesBefore[s])*1e9/n, s+"-ns/op")
	}
	info, err := js.Stream(ctx, cfg.Name)
	if err != nil {
		b.Fatal(err)
	}
	if got := info.CachedInfo().State.Msgs; got < uint64(b.N)+1 {
		b.Fatalf("the stream holds %d events after %d changes", got, b.N+1)
	}
}

// memCache serves one Student from memory, as the informer's cache does;
// everything else goes to the API server.
type memCache struct {
	client.Client
	mu sync.Mutex
	s  *studentv1.Student
}

func (c *memCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if s, ok := obj.(*studentv1.Student); ok {
		c.mu.Lock()
		defer c.mu.Unlock()
		if key == client.ObjectKeyFromObject(c.s) {
			c.s.DeepCopyInto(s)
			return nil
		}
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// stageSums is the sum of each stage's histogram, in seconds.
func stageSums(b *testing.B, names []string) map[string]float64 {
	b.Helper()
	out := map[string]float64{}
	for _, s := range names {
		v, err := stacktest.HistogramSum(stages.Metric, "stage", s)
		if err != nil {
			b.Fatal(err)
		}
		out[s] = v
	}
	return out
}
