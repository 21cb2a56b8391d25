package v1

import (
	"strconv"
	"strings"
)

// Finalizer holds a Student until its deleted event has been acknowledged by
// the broker, so deletes are never lost, even while the bridge is down.
const Finalizer = "example.k8s.io/student-bridge"

// CloudEvent types, one per operation, in reverse-DNS form.
const (
	// EventTypeCreated is published the first time the bridge sees a Student.
	EventTypeCreated = eventTypePrefix + OperationCreated
	// EventTypeUpdated is published when a Student's spec or labels changed
	// since what was last published.
	EventTypeUpdated = eventTypePrefix + OperationUpdated
	// EventTypeDeleted is published once when a Student is deleted; it
	// carries the Student's final state.
	EventTypeDeleted = eventTypePrefix + OperationDeleted
	// EventTypeSnapshot is a replayed copy of a Student's current state, sent
	// on request or at startup; it is not a change.
	EventTypeSnapshot = eventTypePrefix + OperationSnapshot
)

// Operations name the last token of the default NATS subjects
// (student.created, student.updated, student.deleted, student.snapshot).
const (
	OperationCreated  = "created"
	OperationUpdated  = "updated"
	OperationDeleted  = "deleted"
	OperationSnapshot = "snapshot"
)

// Defaults of the contract: where the bridge publishes unless configured
// otherwise, and so where a consumer looks.
const (
	// DefaultStream is the JetStream stream of the events.
	DefaultStream = "STUDENTS"
	// DefaultSubjectPrefix is the first token of every subject
	// (student.created, ...); DefaultSubjects captures them all.
	DefaultSubjectPrefix = "student"
	DefaultSubjects      = DefaultSubjectPrefix + ".>"
	// DefaultSnapshotSubject is where the bridge answers snapshot requests.
	DefaultSnapshotSubject = "student-bridge.snapshot"
	// DefaultRecordsBucket is the bridge's record store.
	DefaultRecordsBucket = "STUDENT_BRIDGE_PUBLISHED"
)

// CloudEvent extension attributes of every change event (created, updated,
// deleted) beyond the core ones.
const (
	// ExtensionSequence is the CloudEvents sequence extension: the
	// Student's own count of published events (1 for its first created,
	// then one more per event), zero-padded to SequenceDigits so it sorts
	// as text. A consumer that sees 7 after 5 missed an event. A snapshot
	// event carries the sequence of the last change published before it
	// (it is a copy, not a change), or none if nothing was published yet.
	ExtensionSequence = "sequence"
	// ExtensionPreviousID is the id of the event published for the Student
	// before this one (absent on its first event); on a snapshot, the id
	// of the last change it copies.
	ExtensionPreviousID = "previousid"
	// SequenceDigits is the width of the zero-padded sequence.
	SequenceDigits = 20
)

// FormatSequence renders a per-Student sequence as ExtensionSequence
// carries it.
func FormatSequence(n int64) string {
	s := strconv.FormatInt(n, 10)
	if len(s) >= SequenceDigits {
		return s
	}
	return strings.Repeat("0", SequenceDigits-len(s)) + s
}

// ParseSequence reads ExtensionSequence; ok is false when v is not a
// sequence (absent: an event of a bridge that did not count yet).
func ParseSequence(v any) (n int64, ok bool) {
	s, isString := v.(string)
	if !isString || s == "" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n > 0
}

// TraceContextAnnotation is the annotation that, on a Student, holds a W3C traceparent
// ("00-<trace id>-<span id>-01") of whatever changed it: the bridge's
// publish span continues that trace, and the CloudEvent carries it on
// (the distributed tracing extension's traceparent), to the services.
const TraceContextAnnotation = "opentelemetry.io/trace-context"

// ExtensionTraceParent and ExtensionTraceState are the CloudEvents
// distributed tracing extension's attributes.
const (
	ExtensionTraceParent = "traceparent"
	ExtensionTraceState  = "tracestate"
)

// ConditionPublished is True when the Student's current generation and labels
// have been published and acknowledged, and False with a reason otherwise.
const ConditionPublished = "Published"

// Reasons of the Published condition, also used for Kubernetes Events.
const (
	// ReasonPublished: the current state was published and acknowledged.
	ReasonPublished = "Published"
	// ReasonPublishFailed: publishing failed; the bridge retries with backoff.
	ReasonPublishFailed = "PublishFailed"
	// ReasonInvalid: the Student cannot be turned into an event (for
	// example it would exceed the broker's maximum payload); retrying will
	// not help until the Student changes.
	ReasonInvalid = "InvalidEvent"
)

// eventTypePrefix is what every Student CloudEvent type starts with; the
// operation follows it.
const eventTypePrefix = "io.k8s.example.student."

// Operation returns the operation of a Student CloudEvent type ("created"
// for EventTypeCreated), the last token of its default subject. A type that
// is not a Student event type returns its last dot-separated token, so
// subjects stay well formed.
func Operation(eventType string) string {
	if op, ok := strings.CutPrefix(eventType, eventTypePrefix); ok {
		return op
	}
	return eventType[strings.LastIndexByte(eventType, '.')+1:]
}
