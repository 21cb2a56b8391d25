package v1

// SnapshotRequest is the JSON body of a request on the bridge's snapshot
// request subject (snapshot.requestSubject, default student-bridge.snapshot).
// An empty body asks for every namespace.
// +kubebuilder:object:generate=false
type SnapshotRequest struct {
	// namespace limits the snapshot to one namespace; empty means all the
	// namespaces the bridge watches.
	// +optional
	Namespace string `json:"namespace,omitempty"`
}

// SnapshotReply is the leading bridge's answer to a SnapshotRequest, sent
// once every snapshot event was acknowledged (or publishing failed).
// +kubebuilder:object:generate=false
type SnapshotReply struct {
	// run identifies the snapshot; its events' ids derive from it.
	Run string `json:"run"`
	// cluster is the answering bridge's cluster (its cluster setting).
	// +optional
	Cluster string `json:"cluster,omitempty"`
	// published counts the snapshot events acknowledged by the stream.
	Published int `json:"published"`
	// error says why the snapshot is incomplete; empty on success.
	// +optional
	Error string `json:"error,omitempty"`
}
