package natssink_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/consumer"
	"github.com/student-bridge/student-bridge/internal/natssink"
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
	// Structured mode keeps white space around an id; a NATS header cannot.
	f.Add("application/cloudevents+json", "", "", "", "", "", []byte(`{"specversion":"1.0","id":"0 ","type":"t","source":"/s"}`))
	f.Fuzz(func(t *testing.T, contentType, specversion, id, typ, source, sequence string, data []byte) {
		h := nats.Header{}
		for k, v := range map[string]string{"Content-Type": contentType, "ce-specversion": specversion, "ce-id": id, "ce-type": typ, "ce-source": source, "ce-sequence": sequence} {
			if v != "" {
				h.Set(k, v)
			}
		}
		ctx := context.Background()
		ev, err := consumer.DecodeMsg(ctx, &nats.Msg{Subject: "student.updated", Header: h, Data: data})
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
			got, err := consumer.DecodeMsg(ctx, msg)
			if err != nil {
				t.Fatalf("%s: an event encoded from an accepted one does not decode: %v\n%s", enc, err, ev)
			}
			if got.ID() != ev.ID() || got.Type() != ev.Type() || got.Source() != ev.Source() {
				t.Fatalf("%s round trip changed the event:\n%s\n%s", enc, ev, got)
			}
		}
	})
}

// FuzzEventRoundTrip: whatever a Student holds, the event built for it is a
// valid CloudEvent that survives both NATS binding modes unchanged, and its
// data decodes to the Student's spec.
func FuzzEventRoundTrip(f *testing.F) {
	f.Add("wang", "china", "default", "object-name", "grade", "3", int64(1))
	f.Add("王伟", "清华大学", "team-a", "a.b.c", "app.kubernetes.io/name", "x", int64(7))
	f.Add("quote\"and\\slash", "new\nline", "ns", "n", "k", "", int64(0))
	f.Add("\xff\xfe", "\x00", "z", "0", "", "", int64(-1))
	f.Fuzz(func(t *testing.T, name, school, ns, objName, labelKey, labelValue string, gen int64) {
		// The API server admits no other namespace or name; the subject is made of them.
		if len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(objName)) > 0 {
			t.Skip("no Student can have this namespace or name")
		}
		s := &studentv1.Student{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: objName, UID: "uid", Generation: gen, Labels: map[string]string{labelKey: labelValue}},
			Spec:       studentv1.StudentSpec{Name: name, School: school},
		}
		for _, typ := range []string{studentv1.EventTypeCreated, studentv1.EventTypeUpdated, studentv1.EventTypeDeleted, studentv1.EventTypeSnapshot} {
			prev := &studentv1.PublishedEvent{Spec: studentv1.StudentSpec{Name: school, School: name}}
			ev, err := contract.NewEvent("c", typ, contract.EventID(typ, s, "p"), s, prev, time.Unix(1700000000, 0))
			if err != nil {
				t.Fatalf("NewEvent: %v", err)
			}
			for _, enc := range []natssink.Encoding{natssink.Structured, natssink.Binary} {
				msg, err := natssink.EncodeMsg(context.Background(), ev, "student.x", enc)
				if err != nil {
					t.Fatalf("encode %s: %v", enc, err)
				}
				got, err := consumer.DecodeMsg(context.Background(), msg)
				if err != nil {
					t.Fatalf("decode %s: %v", enc, err)
				}
				if got.ID() != ev.ID() || got.Type() != ev.Type() || got.Subject() != ev.Subject() || got.Source() != ev.Source() ||
					!got.Time().Equal(ev.Time()) || !bytes.Equal(got.Data(), ev.Data()) {
					t.Fatalf("%s round trip changed the event:\n%s\n%s", enc, ev, got)
				}
			}
			var data studentv1.StudentEventData
			if err := json.Unmarshal(ev.Data(), &data); err != nil {
				t.Fatalf("data: %v", err)
			}
			want := s.Spec
			// JSON carries text: invalid UTF-8 arrives as U+FFFD.
			wb, _ := json.Marshal(want)
			_ = json.Unmarshal(wb, &want)
			if data.Spec != want {
				t.Fatalf("data spec %+v, want %+v", data.Spec, want)
			}
		}
	})
}
