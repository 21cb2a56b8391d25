package consumer

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// event is the part of a Student CloudEvent the mirror reads.
type event struct {
	id, typ string
	cluster string // named by the source
	number  int64  // the Student sequence; 0: none
	// traceparent is the event's W3C trace context, if it carries one.
	traceparent string
	data        studentv1.StudentEventData
}

func (e *event) desired(seq uint64) *Desired {
	md := e.data.Metadata
	return &Desired{Cluster: e.cluster, UID: md.UID, Namespace: md.Namespace, Name: md.Name, Generation: md.Generation,
		Spec: e.data.Spec, Labels: md.Labels, EventID: e.id, EventType: e.typ, Sequence: seq, StudentSequence: e.number}
}

// decode reads a Student CloudEvent in either encoding of the NATS binding.
func decode(msg jetstream.Msg) (*event, error) {
	ce, err := DecodeMsg(context.Background(), &nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()})
	if err != nil {
		return nil, err
	}
	ev := &event{id: ce.ID(), typ: ce.Type(), cluster: studentv1.ClusterOfSource(ce.Source())}
	ev.number, _ = studentv1.ParseSequence(ce.Extensions()[studentv1.ExtensionSequence])
	ev.traceparent, _ = ce.Extensions()[studentv1.ExtensionTraceParent].(string)
	if err := json.Unmarshal(ce.Data(), &ev.data); err != nil {
		return nil, fmt.Errorf("data of %s: %w", ev.id, err)
	}
	if ev.data.Metadata.UID == "" {
		return nil, fmt.Errorf("event %s names no Student uid", ev.id)
	}
	return ev, nil
}
