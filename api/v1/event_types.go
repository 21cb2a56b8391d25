package v1

// StudentEventData is the data of every Student CloudEvent
// (datacontenttype application/json). Consumers decode it to learn the
// desired state; previousSpec lets them see what an update changed.
type StudentEventData struct {
	// metadata identifies the Student and the version that was published.
	Metadata EventObjectMeta `json:"metadata"`

	// spec is the Student's spec at the time of the event.
	Spec StudentSpec `json:"spec"`

	// previousSpec is the spec published before this update; set on
	// updated events only.
	// +optional
	PreviousSpec *StudentSpec `json:"previousSpec,omitempty"`
}

// EventObjectMeta is the part of a Student's metadata that events carry.
type EventObjectMeta struct {
	// namespace of the Student.
	Namespace string `json:"namespace"`
	// name of the Student.
	Name string `json:"name"`
	// uid of the Student; a Student deleted and created again with the same
	// name has a new uid.
	UID string `json:"uid"`
	// generation of the Student that was published.
	Generation int64 `json:"generation"`
	// resourceVersion of the Student that was published.
	ResourceVersion string `json:"resourceVersion"`
	// labels of the Student.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
}
