package v1

import (
	"encoding/json"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReceiptsBucket is the default JetStream key-value bucket where services
// report what they applied: one key per service and Student,
// ReceiptKey(service, uid), holding a Receipt as JSON.
const ReceiptsBucket = "STUDENT_BRIDGE_RECEIPTS"

// Results a service reports in a Receipt.
const (
	// ResultApplied: the service applied the event's desired state.
	ResultApplied = "applied"
	// ResultFailed: the service could not apply it (message says why); it
	// is expected to retry.
	ResultFailed = "failed"
)

// MaxReceiptMessage bounds Receipt.Message; a longer one makes the receipt
// invalid, so that no service can grow a Student's status without bound.
const MaxReceiptMessage = 1024

// Receipt is what a business service reports about one Student: the last
// event it handled and whether it applied it. Services in any language
// write it as plain JSON into the receipts bucket.
type Receipt struct {
	// service is the reporting service's name (letters, digits, '-', '_').
	Service string `json:"service"`
	// uid of the Student.
	UID string `json:"uid"`
	// cluster of the Student, when a service on a fleet's hub reports it
	// (the key is then FleetReceiptKey); a bridge skips receipts naming
	// another cluster than its own.
	// +optional
	Cluster string `json:"cluster,omitempty"`
	// namespace of the Student.
	Namespace string `json:"namespace"`
	// name of the Student.
	Name string `json:"name"`
	// eventID is the CloudEvent id the service handled.
	EventID string `json:"eventID"`
	// generation is the Student's metadata.generation that event carried.
	Generation int64 `json:"generation"`
	// result is applied or failed.
	Result string `json:"result"`
	// message says why it failed; optional.
	Message string `json:"message,omitempty"`
	// time is when the service handled the event.
	Time metav1.Time `json:"time"`
	// traceID is the W3C trace id of the service's handling, when it was
	// traced (consumer.Mirror sets it): the trace that began with the
	// change of the Student.
	TraceID string `json:"traceID,omitempty"`
}

// ReceiptKey is the key of service's receipt for the Student with uid.
func ReceiptKey(service, uid string) string { return service + "." + uid }

// ValidServiceName reports whether name can name a service: a key token of
// the receipts bucket and a NATS user's permission subject.
func ValidServiceName(name string) bool {
	if name == "" || len(name) > 63 {
		return false
	}
	return strings.Trim(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") == ""
}

// ParseReceipt decodes and checks the value of key in the receipts bucket.
func ParseReceipt(key string, value []byte) (Receipt, error) {
	var rec Receipt
	if err := json.Unmarshal(value, &rec); err != nil {
		return rec, fmt.Errorf("not a receipt: %w", err)
	}
	return rec, rec.Validate(key)
}

// Validate checks a receipt read from key (empty: not checked against a
// key).
func (r *Receipt) Validate(key string) error {
	switch {
	case !ValidServiceName(r.Service):
		return fmt.Errorf("service %q is not a valid service name", r.Service)
	case r.UID == "" || strings.ContainsAny(r.UID, ". *>"):
		return fmt.Errorf("uid %q is not a Student uid", r.UID)
	case r.Cluster != "" && !ValidClusterName(r.Cluster):
		return fmt.Errorf("cluster %q is not a valid cluster name", r.Cluster)
	case key != "" && key != ReceiptKey(r.Service, r.UID) && (r.Cluster == "" || key != FleetReceiptKey(r.Cluster, r.Service, r.UID)):
		return fmt.Errorf("key %s does not match service %q and uid %q", key, r.Service, r.UID)
	case r.Namespace == "" || r.Name == "":
		return fmt.Errorf("namespace and name are required")
	case r.EventID == "":
		return fmt.Errorf("eventID is required")
	case r.Result != ResultApplied && r.Result != ResultFailed:
		return fmt.Errorf("result %q: want %s or %s", r.Result, ResultApplied, ResultFailed)
	case len(r.Message) > MaxReceiptMessage:
		return fmt.Errorf("message of %d bytes is over %d", len(r.Message), MaxReceiptMessage)
	}
	return nil
}

// ConditionInSync is True when every expected service has applied the
// latest published change of the Student.
const ConditionInSync = "InSync"

// Reasons of the InSync condition.
const (
	// ReasonAllApplied: every expected service applied the latest change.
	ReasonAllApplied = "AllApplied"
	// ReasonServicesBehind: a service has not yet applied the latest change.
	ReasonServicesBehind = "ServicesBehind"
	// ReasonServiceFailed: a service reported that it failed to apply it;
	// also the reason of the Warning Event.
	ReasonServiceFailed = "ServiceFailed"
)

// States of a service in ServiceStatus.
const (
	// ServiceInSync: the service applied the latest published change.
	ServiceInSync = "InSync"
	// ServiceBehind: the service applied an earlier change, or none yet.
	ServiceBehind = "Behind"
	// ServiceFailed: the service reported a failure.
	ServiceFailed = "Failed"
)

// State is the state of the service that wrote r, given the id of the
// event last published for its Student ("" if none).
func (r *Receipt) State(publishedID string) string {
	switch {
	case r.Result == ResultFailed:
		return ServiceFailed
	case publishedID != "" && r.EventID == publishedID:
		return ServiceInSync
	default:
		return ServiceBehind
	}
}

// ServiceStatus is what one service reported about the Student.
type ServiceStatus struct {
	// name of the service.
	// +required
	Name string `json:"name"`

	// state is InSync, Behind or Failed.
	// +required
	// +kubebuilder:validation:Enum=InSync;Behind;Failed
	State string `json:"state"`

	// appliedEventID is the event the service last reported on.
	// +optional
	AppliedEventID string `json:"appliedEventID,omitempty"`

	// appliedGeneration is the Student's generation that event carried.
	// +optional
	AppliedGeneration int64 `json:"appliedGeneration,omitempty"`

	// message is the service's message with a failure.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// time is when the service reported.
	// +optional
	Time *metav1.Time `json:"time,omitempty"`

	// traceID is the trace of the service's handling of that event, when
	// it was traced: look it up in the tracing backend.
	// +optional
	TraceID string `json:"traceID,omitempty"`
}
