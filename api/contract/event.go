// Package contract is the bridge's wire contract in code: what a change is
// (NextChange), the CloudEvent published for it (NewEvent, with the id
// EventID derives, its Source and Subject, and its place in the Student's
// sequence: Chain, Sequence) and the record the bridge keeps of it
// (ParseRecord). The bridge, verify, tail and services written in Go use
// it; docs/contract.md is the same contract in prose. The types and names
// it builds from are api/v1's.
//
// It is part of the module's public API, with api/v1 and consumer:
// what it exports stays compatible from one release to the next, and make
// test compares it with the last release's (internal/publicapi).
package contract

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// Source returns the CloudEvent source of Students in a cluster: the
// collection every Student event comes from. Together with the id it is
// unique per change, so consumers can dedupe on source+id.
func Source(cluster string) string {
	return "/clusters/" + cluster + "/apis/" + studentv1.GroupVersion.String() + "/students"
}

// Subject returns the CloudEvent subject of a Student: "namespace/name".
func Subject(s *studentv1.Student) string {
	return s.Namespace + "/" + s.Name
}

// EventID derives the CloudEvent id of a change. It is deterministic, so a
// change published twice (say after a crash between the broker's ack and the
// status write) carries the same id and JetStream drops the copy. It chains in
// the previously published id, so returning to an earlier state is a new
// change with a new id.
func EventID(eventType string, s *studentv1.Student, previousID string) string {
	// The hashed bytes are part of the contract: an upgraded bridge that
	// publishes a change again must give it the same id (TestEventIDIsStable).
	// They are written as fields separated by NUL, without fmt: an id is
	// made per publish.
	buf := make([]byte, 0, 256)
	buf = append(append(append(append(buf, s.UID...), 0), eventType...), 0)
	if eventType != studentv1.EventTypeDeleted {
		buf = append(strconv.AppendInt(buf, s.Generation, 10), 0)
		buf = append(append(append(append(buf, s.Spec.Name...), 0), s.Spec.School...), 0)
		for _, k := range slices.Sorted(maps.Keys(s.Labels)) {
			buf = append(append(append(append(buf, k...), '='), s.Labels[k]...), 0)
		}
		buf = append(buf, previousID...)
	}
	sum := sha256.Sum256(buf)
	return hex.EncodeToString(sum[:16])
}

// NewEvent builds the CloudEvent for a change of s. previous is what was last
// published for s (nil if nothing); for updates its spec travels as
// previousSpec. id is normally EventID's. Chain adds its place in the
// Student's sequence.
func NewEvent(cluster, eventType, id string, s *studentv1.Student, previous *studentv1.PublishedEvent, now time.Time) (cloudevents.Event, error) {
	ev := cloudevents.NewEvent(cloudevents.VersionV1)
	ev.SetID(id)
	ev.SetType(eventType)
	ev.SetSource(Source(cluster))
	ev.SetSubject(Subject(s))
	ev.SetTime(now.UTC())
	ev.SetDataSchema(DataSchema(eventType))
	data := studentv1.StudentEventData{
		Metadata: studentv1.EventObjectMeta{
			Namespace:       s.Namespace,
			Name:            s.Name,
			UID:             string(s.UID),
			Generation:      s.Generation,
			ResourceVersion: s.ResourceVersion,
			Labels:          s.Labels,
		},
		Spec: s.Spec,
	}
	if eventType == studentv1.EventTypeUpdated && previous != nil {
		prev := previous.Spec
		data.PreviousSpec = &prev
	}
	if err := ev.SetData(cloudevents.ApplicationJSON, data); err != nil {
		return ev, fmt.Errorf("encode data of %s: %w", Subject(s), err)
	}
	if err := ev.Validate(); err != nil {
		return ev, fmt.Errorf("invalid event for %s: %w", Subject(s), err)
	}
	return ev, nil
}

// NextChange decides which event, if any, the current state of s needs, given
// what was last published. Status, finalizer and annotation changes are not
// changes; spec (generation) and label changes are. A state of an older
// generation than the one last published needs nothing: it is a cache that
// is behind (a replica that just took over the Student's shard, whose watch
// has not yet shown what the previous holder published), and its watch
// brings the newer state.
func NextChange(s *studentv1.Student, last *studentv1.PublishedEvent) string {
	switch {
	case last != nil && s.Generation < last.Generation:
		return ""
	case !s.DeletionTimestamp.IsZero():
		if last != nil && last.Type == studentv1.EventTypeDeleted {
			return ""
		}
		return studentv1.EventTypeDeleted
	case last == nil || last.Type == studentv1.EventTypeDeleted:
		// Never published, or published as gone (it left the watched
		// scope) and back: consumers learn of it anew.
		return studentv1.EventTypeCreated
	case last.Generation != s.Generation || !maps.Equal(last.Labels, s.Labels):
		return studentv1.EventTypeUpdated
	}
	return ""
}

// Chain sets ev's place in its Student's events: its sequence (none when 0)
// and the id of the event before it (none when empty).
func Chain(ev *cloudevents.Event, sequence int64, previousID string) {
	if sequence > 0 {
		ev.SetExtension(studentv1.ExtensionSequence, studentv1.FormatSequence(sequence))
	}
	if previousID != "" {
		ev.SetExtension(studentv1.ExtensionPreviousID, previousID)
	}
}

// Sequence is the per-Student sequence an event of eventType carries after
// previous (nil: nothing published yet): one more than previous's, so 1 for
// a Student's first event. A snapshot is no change: it carries previous's
// count (0, none, when there is nothing to copy).
func Sequence(eventType string, previous *studentv1.PublishedEvent) int64 {
	var last int64
	if previous != nil {
		last = previous.StudentSequence
	}
	if eventType == studentv1.EventTypeSnapshot {
		return last
	}
	return last + 1
}
