package natssink_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/student-bridge/student-bridge/sink/natssink"
)

// FuzzDecodeMsg: whatever is published on a Student subject, in either
// encoding (binary mode's ce- headers included), DecodeMsg (what tail and
// verify read events with) returns a valid CloudEvent or an error; never a
// panic. What it accepts survives both encodings unchanged.
func FuzzDecodeMsg(f *testing.F) {
	f.Add("application/cloudevents+json", "", "", "", "", "", []byte(`{"specversion":"1.0","id":"e1","type":"t","source":"/s","data":{"a":1}}`))
	f.Add("application/json", "1.0", "e1", "io.k8s.example.student.updated", "/clusters/default/apis/example.k8s.io/v1/students", "00000000000000000002", []byte(`{"metadata":{"uid":"u1"}}`))
	f.Add("", "1.0", "e1", "t", "/s", "", []byte(`{}`))
	f.Add("application/cloudevents+json", "", "", "", "", "", []byte(`{"specversion":"0.3"`))
	f.Add("text/plain", "1.0", "", "t", "%zz", "x", []byte("\x00\xff"))
	f.Fuzz(func(t *testing.T, contentType, specversion, id, typ, source, sequence string, data []byte) {
		h := nats.Header{}
		for k, v := range map[string]string{"Content-Type": contentType, "ce-specversion": specversion, "ce-id": id, "ce-type": typ, "ce-source": source, "ce-sequence": sequence} {
			if v != "" {
				h.Set(k, v)
			}
		}
		ctx := context.Background()
		ev, err := natssink.DecodeMsg(ctx, &nats.Msg{Subject: "student.updated", Header: h, Data: data})
		if err != nil {
			return
		}
		if err := ev.Validate(); err != nil {
			t.Fatalf("decoded an invalid CloudEvent: %v\n%s", err, ev)
		}
		for _, enc := range []natssink.Encoding{natssink.Structured, natssink.Binary} {
			msg, err := natssink.EncodeMsg(ctx, *ev, "student.updated", enc)
			if err != nil {
				continue // not every accepted event has a form in both encodings
			}
			got, err := natssink.DecodeMsg(ctx, msg)
			if err != nil {
				t.Fatalf("%s: an event encoded from an accepted one does not decode: %v\n%s", enc, err, ev)
			}
			if got.ID() != ev.ID() || got.Type() != ev.Type() || got.Source() != ev.Source() {
				t.Fatalf("%s round trip changed the event:\n%s\n%s", enc, ev, got)
			}
		}
	})
}
