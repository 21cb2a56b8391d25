package reconciler

import (
	"context"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// tracer makes the bridge's spans, from the tracer provider set up now
// (internal/tracing; asked each time, as a later setup replaces it).
func tracer() trace.Tracer { return otel.Tracer("github.com/student-bridge/student-bridge/reconciler") }

// tracing reports whether spans go anywhere: internal/tracing installs the
// no-op provider when traces have nowhere to go, and then the bridge makes
// no span at all (not even its name and attributes, a tenth of a change's
// allocations). A trace context a Student carries still goes on to its
// event.
func tracing() bool {
	_, off := otel.GetTracerProvider().(noop.TracerProvider)
	return !off
}

// startPublish starts the span of one publish of stu: a child of the trace
// context in stu's TraceContextAnnotation, if it carries one, so that a
// trace can begin at whatever changed the Student.
func startPublish(ctx context.Context, stu *studentv1.Student, typ string) (context.Context, trace.Span) {
	if tp := stu.Annotations[studentv1.TraceContextAnnotation]; tp != "" {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": tp})
	}
	if !tracing() {
		return ctx, trace.SpanFromContext(ctx) // the Student's, not recording, or none
	}
	return tracer().Start(ctx, "publish "+studentv1.Operation(typ), trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("student", contract.Subject(stu)), attribute.String("student.uid", string(stu.UID))))
}

// startStep starts a child span of one step of a publish.
func startStep(ctx context.Context, name string) (context.Context, trace.Span) {
	if !tracing() {
		return ctx, trace.SpanFromContext(ctx)
	}
	return tracer().Start(ctx, name)
}

// endSpan ends span, marking it failed with err.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// carryTrace puts ctx's trace context into ev, as the CloudEvents
// distributed tracing extension (traceparent, tracestate), so that a
// consumer continues the trace.
func carryTrace(ctx context.Context, ev *cloudevents.Event) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return // nothing to carry (and no carrier to allocate)
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	if tp := c["traceparent"]; tp != "" {
		ev.SetExtension(studentv1.ExtensionTraceParent, tp)
	}
	if ts := c["tracestate"]; ts != "" {
		ev.SetExtension(studentv1.ExtensionTraceState, ts)
	}
}
