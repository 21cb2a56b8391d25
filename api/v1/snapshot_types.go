package v1

import (
	"encoding/json"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

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
// once every snapshot event of the run that answers it was acknowledged
// (or publishing failed). Requests are coalesced: one that arrives while a
// run covering its namespace is in flight, or soon after one ended
// (snapshot.minInterval) whose events the stream still holds, is answered
// by that run.
// +kubebuilder:object:generate=false
type SnapshotReply struct {
	// run identifies the snapshot; its events' ids derive from it.
	Run string `json:"run"`
	// cluster is the answering bridge's cluster (its cluster setting).
	// +optional
	Cluster string `json:"cluster,omitempty"`
	// published counts the snapshot events acknowledged by the stream.
	Published int `json:"published"`
	// coalesced is true when a run made for an earlier request answers
	// this one: its events may be in the stream before the request.
	// +optional
	Coalesced bool `json:"coalesced,omitempty"`
	// firstSequence is the stream sequence of the run's first event (0
	// when it published none, or on core NATS): read from there to see
	// them all.
	// +optional
	FirstSequence uint64 `json:"firstSequence,omitempty"`
	// ended is when the run ended (RFC 3339).
	// +optional
	Ended string `json:"ended,omitempty"`
	// nextRun is the earliest time (RFC 3339) a request for the same
	// namespaces starts a new run; until then a run that answered is
	// reused.
	// +optional
	NextRun string `json:"nextRun,omitempty"`
	// error says why the snapshot is incomplete; empty on success.
	// +optional
	Error string `json:"error,omitempty"`
}

// ParseSnapshotRequest decodes the body of a snapshot request: empty, or
// a JSON object whose namespace, if set, is a namespace name.
func ParseSnapshotRequest(body []byte) (SnapshotRequest, error) {
	var req SnapshotRequest
	if len(body) == 0 {
		return req, nil
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return SnapshotRequest{}, fmt.Errorf("bad request: %w", err)
	}
	if req.Namespace != "" {
		if errs := validation.IsDNS1123Label(req.Namespace); len(errs) > 0 {
			return SnapshotRequest{}, fmt.Errorf("bad request: namespace %q: %s", req.Namespace, strings.Join(errs, "; "))
		}
	}
	return req, nil
}
