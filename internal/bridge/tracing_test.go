package bridge_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/consumer"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// spanSink is an OTLP/gRPC trace receiver: what the bridge and the Mirror
// export.
type spanSink struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []span
}

type span struct {
	name, traceID, spanID, parentID string
}

func (s *spanSink) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				s.spans = append(s.spans, span{name: sp.GetName(), traceID: hex.EncodeToString(sp.GetTraceId()),
					spanID: hex.EncodeToString(sp.GetSpanId()), parentID: hex.EncodeToString(sp.GetParentSpanId())})
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// inTrace returns the spans of trace id, by name.
func (s *spanSink) inTrace(id string) map[string]span {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]span{}
	for _, sp := range s.spans {
		if sp.traceID == id {
			out[sp.name] = sp
		}
	}
	return out
}

func startSpanSink(t *testing.T) (*spanSink, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	sink := &spanSink{}
	collectortrace.RegisterTraceServiceServer(srv, sink)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return sink, ln.Addr().String()
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// TestTraceFromStudentToService: one trace from the trace context in a
// Student's annotation, through the bridge's publish (its publish, JetStream
// and record spans, exported over OTLP), the CloudEvent's traceparent, to
// the Mirror's span of the service applying it, whose trace id is in the
// service's receipt and on the Student's status; in both encodings.
func TestTraceFromStudentToService(t *testing.T) {
	for _, enc := range []string{"structured", "binary"} {
		t.Run(enc, func(t *testing.T) { testTrace(t, enc) })
	}
}

// TestTraceContextWithoutTracing: with traces going nowhere (no OTLP
// endpoint: the bridge makes no spans), the trace context in a Student's
// annotation still goes on to its event, for the consumers' spans.
func TestTraceContextWithoutTracing(t *testing.T) {
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "notrace")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	startBridge(t, cfg)
	traceID, parent := randomHex(t, 16), randomHex(t, 8)
	stu := newStudent(ns, "traced", "wang", "china")
	stu.Annotations = map[string]string{studentv1.TraceContextAnnotation: fmt.Sprintf("00-%s-%s-01", traceID, parent)}
	if err := st.Client.Create(context.Background(), stu); err != nil {
		t.Fatal(err)
	}
	ev := waitStream(t, natsConn(t), cfg.NATS.Stream.Name, 1)[0]
	if tp, _ := ev.Event.Extensions()[studentv1.ExtensionTraceParent].(string); tp != stu.Annotations[studentv1.TraceContextAnnotation] {
		t.Errorf("the CloudEvent's traceparent %q, want the Student's %q", tp, stu.Annotations[studentv1.TraceContextAnnotation])
	}
}

func testTrace(t *testing.T, enc string) {
	ctx := context.Background()
	spans, addr := startSpanSink(t)
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "trace"+enc)
	cfg.NATS.Encoding = enc
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://"+addr) // http: without TLS
	cfg.Status.QPS = 100
	startBridge(t, cfg)
	nc := natsConn(t)

	traceID, parent := randomHex(t, 16), randomHex(t, 8)
	stu := newStudent(ns, "traced", "wang", "china")
	stu.Annotations = map[string]string{studentv1.TraceContextAnnotation: fmt.Sprintf("00-%s-%s-01", traceID, parent)}
	if err := st.Client.Create(ctx, stu); err != nil {
		t.Fatal(err)
	}

	// A second Student, of another trace, that the service fails on.
	failedTrace := randomHex(t, 16)
	refused := newStudent(ns, "refused", "li", "china")
	refused.Annotations = map[string]string{studentv1.TraceContextAnnotation: fmt.Sprintf("00-%s-%s-01", failedTrace, randomHex(t, 8))}
	if err := st.Client.Create(ctx, refused); err != nil {
		t.Fatal(err)
	}

	evs := waitStream(t, nc, cfg.NATS.Stream.Name, 2)
	if evs[0].Data.Metadata.Name != "traced" {
		evs[0], evs[1] = evs[1], evs[0]
	}
	m, err := consumer.NewMirror(nc, consumer.MirrorOptions{Service: "roster", Stream: cfg.NATS.Stream.Name, Subjects: cfg.NATS.SubjectPrefix + ".>",
		ReceiptsBucket: cfg.Receipts.Bucket, SnapshotSubject: consumer.NoSnapshots, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: func(_ context.Context, c consumer.Change) error {
			if c.Name == "refused" {
				return errors.New("the roster is full")
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	// The service starts once the stream is there.
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Run(mctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("mirror: %v", err)
		}
	}()

	tp, _ := evs[0].Event.Extensions()[studentv1.ExtensionTraceParent].(string)
	if len(tp) != 55 || tp[3:35] != traceID {
		t.Errorf("the CloudEvent's traceparent %q is not of trace %s", tp, traceID)
	}
	if got := evs[0].Header.Get("traceparent"); got != tp {
		t.Errorf("the message's traceparent header %q, want the event's %q", got, tp)
	}

	stacktest.WaitFor(t, "the spans of the publish and of the service applying it", func() error {
		got := spans.inTrace(traceID)
		for _, name := range []string{"publish created", "jetstream publish", "record", "apply roster"} {
			if _, ok := got[name]; !ok {
				return fmt.Errorf("trace %s has spans %v, not %q", traceID, got, name)
			}
		}
		if got["publish created"].parentID != parent {
			return fmt.Errorf("the publish span's parent is %s, not the annotation's span %s", got["publish created"].parentID, parent)
		}
		if got["apply roster"].parentID != got["publish created"].spanID {
			return fmt.Errorf("the service's span's parent is %s, not the publish span %s", got["apply roster"].parentID, got["publish created"].spanID)
		}
		return nil
	})

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	receipts, err := js.KeyValue(ctx, cfg.Receipts.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, "the receipt and the status naming the trace", func() error {
		e, err := receipts.Get(ctx, studentv1.ReceiptKey("roster", string(stu.UID)))
		if err != nil {
			return err
		}
		r, err := studentv1.ParseReceipt(e.Key(), e.Value())
		if err != nil || r.TraceID != traceID {
			return fmt.Errorf("receipt %+v (%v), want trace id %s", r, err, traceID)
		}
		s := getStudent(t, ns, "traced")
		if len(s.Status.Services) != 1 || s.Status.Services[0].TraceID != traceID {
			return fmt.Errorf("status.services %+v, want roster with trace id %s", s.Status.Services, traceID)
		}
		// A failure names the handling's trace too: it is what the
		// operator looks up.
		e, err = receipts.Get(ctx, studentv1.ReceiptKey("roster", string(refused.UID)))
		if err != nil {
			return err
		}
		if r, err := studentv1.ParseReceipt(e.Key(), e.Value()); err != nil || r.Result != studentv1.ResultFailed || r.TraceID != failedTrace {
			return fmt.Errorf("the failed change's receipt %+v (%v), want failed with trace id %s", r, err, failedTrace)
		}
		return nil
	})
}
