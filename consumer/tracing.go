package consumer

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The Mirror's spans come from the process's tracer provider (otel's
// global one): a service that sets one up sees a span per change it
// applies, a child of the bridge's publish span, and finds the trace id in
// its receipt (and so on the Student's status.services). Without one they
// are no-ops, and a receipt carries the id of the trace the event came in.
func tracer() trace.Tracer { return otel.Tracer("github.com/student-bridge/student-bridge/consumer") }

// startApply starts the span of the service applying c.
func (m *Mirror) startApply(ctx context.Context, c Change) (context.Context, trace.Span) {
	if c.TraceParent != "" {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": c.TraceParent})
	}
	return tracer().Start(ctx, "apply "+m.o.Service, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("student", c.Namespace+"/"+c.Name), attribute.String("student.uid", c.UID),
			attribute.String("cloudevents.event_id", c.EventID)))
}

func endApply(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
