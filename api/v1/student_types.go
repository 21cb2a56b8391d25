package v1

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// StudentSpec is the desired state of a Student: who the student is and which
// school they attend. Business services receive it in every CloudEvent.
type StudentSpec struct {
	// name is the student's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Name string `json:"name"`

	// school is the school the student attends.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	School string `json:"school"`
}

// PublishedEvent records the last CloudEvent the bridge published for a
// Student and JetStream acknowledged.
type PublishedEvent struct {
	// type is the CloudEvent type, e.g. io.k8s.example.student.created.
	// +required
	Type string `json:"type"`

	// id is the CloudEvent id, also sent as the JetStream Nats-Msg-Id.
	// +required
	ID string `json:"id"`

	// time is when the event was published.
	// +required
	Time metav1.Time `json:"time"`

	// generation is the metadata.generation of the Student that was published.
	// +required
	Generation int64 `json:"generation"`

	// sequence is the JetStream stream sequence of the event; 0 when the
	// bridge publishes on core NATS, which has no sequence.
	// +optional
	Sequence int64 `json:"sequence,omitempty"`

	// studentSequence counts the events published for the Student's uid,
	// 1 for its first created; the event carries it as its CloudEvent
	// sequence attribute. 0 in records written before the bridge counted
	// (the next event then carries 1).
	// +optional
	StudentSequence int64 `json:"studentSequence,omitempty"`

	// spec is the spec that was published.
	// +required
	Spec StudentSpec `json:"spec"`

	// labels are the labels that were published.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
}

// StudentStatus is what the bridge observed and published for a Student.
type StudentStatus struct {
	// observedGeneration is the metadata.generation the bridge last handled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// lastPublished is the last event JetStream acknowledged for this Student.
	// +optional
	LastPublished *PublishedEvent `json:"lastPublished,omitempty"`

	// conditions describe the Student's publishing state and whether the
	// services applied it; see ConditionPublished and ConditionInSync.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// services is what each reporting service applied (from its receipts).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Services []ServiceStatus `json:"services,omitempty"`

	// servicesInSync counts the expected services that applied the latest
	// change, e.g. "1/2"; empty when no service is expected or reporting.
	// +optional
	ServicesInSync string `json:"servicesInSync,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=stu,scope=Namespaced
// +kubebuilder:metadata:annotations="api-approved.kubernetes.io=unapproved, example group for the student-bridge tutorial"
// +kubebuilder:printcolumn:name="Student",type=string,JSONPath=`.spec.name`
// +kubebuilder:printcolumn:name="School",type=string,JSONPath=`.spec.school`
// +kubebuilder:printcolumn:name="Published",type=string,JSONPath=`.status.conditions[?(@.type=="Published")].status`
// +kubebuilder:printcolumn:name="In-Sync",type=string,JSONPath=`.status.servicesInSync`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// Student is a student at a school. Every change to a Student is published as
// a CloudEvent on NATS by student-bridge.
type Student struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state of the Student.
	// +required
	Spec StudentSpec `json:"spec"`

	// status is what the bridge has published for the Student.
	// +optional
	Status StudentStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// StudentList is a list of Students.
type StudentList struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`

	// items are the Students.
	Items []Student `json:"items"`
}

// StudentRecord is what the bridge remembers of a Student it published: one
// JSON value per Student uid in the record store (a JetStream key-value
// bucket, by default STUDENT_BRIDGE_PUBLISHED), readable with
// `nats kv get STUDENT_BRIDGE_PUBLISHED <uid>`.
// +kubebuilder:object:generate=false
type StudentRecord struct {
	// namespace of the Student.
	Namespace string `json:"namespace"`
	// name of the Student.
	Name string `json:"name"`
	// uid of the Student; also the record's key.
	UID types.UID `json:"uid"`
	// published is the last event JetStream acknowledged for the Student,
	// or, while event is set, the event reserved to go out next.
	Published PublishedEvent `json:"published"`
	// pending is true while the Student's first event is reserved (see
	// event): nothing of the Student is known to be out yet.
	// +optional
	Pending bool `json:"pending,omitempty"`
	// event is set while the event in published is reserved: the record is
	// written with compare-and-set before the event goes out, so that only
	// one writer can give the Student's next number to an event, and
	// whoever reads the record next (the same bridge after a restart, or
	// the replica that takes over its shard) publishes this CloudEvent
	// (structured JSON) as it is, with the same id, before any other. It
	// is cleared once JetStream acknowledged it. Records written before
	// v0.3.0 have none.
	// +optional
	Event json.RawMessage `json:"event,omitempty"`
}

// Reserved reports whether the record reserves an event that may not be
// out yet (event is set).
func (r StudentRecord) Reserved() bool { return len(r.Event) > 0 }
