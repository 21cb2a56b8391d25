package reconciler_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/reconciler"
	"github.com/student-bridge/student-bridge/sink/natssink"
)

// FuzzEventRoundTrip: whatever a Student holds, the event built for it is a
// valid CloudEvent that survives both NATS binding modes unchanged, and its
// data decodes to the Student's spec.
func FuzzEventRoundTrip(f *testing.F) {
	f.Add("wang", "china", "default", "object-name", "grade", "3", int64(1))
	f.Add("王伟", "清华大学", "team-a", "a.b.c", "app.kubernetes.io/name", "x", int64(7))
	f.Add("quote\"and\\slash", "new\nline", "ns", "n", "k", "", int64(0))
	f.Add("\xff\xfe", "\x00", "", "", "", "", int64(-1))
	f.Fuzz(func(t *testing.T, name, school, ns, objName, labelKey, labelValue string, gen int64) {
		s := &studentv1.Student{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: objName, UID: "uid", Generation: gen, Labels: map[string]string{labelKey: labelValue}},
			Spec:       studentv1.StudentSpec{Name: name, School: school},
		}
		for _, typ := range []string{studentv1.EventTypeCreated, studentv1.EventTypeUpdated, studentv1.EventTypeDeleted, studentv1.EventTypeSnapshot} {
			prev := &studentv1.PublishedEvent{Spec: studentv1.StudentSpec{Name: school, School: name}}
			ev, err := reconciler.NewEvent("c", typ, reconciler.EventID(typ, s, "p"), s, prev, time.Unix(1700000000, 0))
			if err != nil {
				t.Fatalf("NewEvent: %v", err)
			}
			for _, enc := range []natssink.Encoding{natssink.Structured, natssink.Binary} {
				msg, err := natssink.EncodeMsg(context.Background(), ev, "student.x", enc)
				if err != nil {
					t.Fatalf("encode %s: %v", enc, err)
				}
				got, err := natssink.DecodeMsg(context.Background(), msg)
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

// FuzzParseRecord: whatever the record store's bucket holds under a key
// (a record of another version, a value written by hand), ParseRecord
// returns a record of the Student the key names, or nothing; never a
// panic. A record it returns survives being written again.
func FuzzParseRecord(f *testing.F) {
	f.Add("u1", []byte(`{"namespace":"default","name":"wang","uid":"u1","published":{"type":"io.k8s.example.student.created","id":"e1","generation":1,"sequence":3,"studentSequence":1,"spec":{"name":"wang","school":"china"}}}`))
	f.Add("u1", []byte(`{"namespace":"default","name":"wang","uid":"u1","pending":true,"published":{"type":"io.k8s.example.student.created","id":"e1"}}`))
	f.Add("u1", []byte(`{"uid":"u2"}`))
	f.Add("u1", []byte(`{"uid":"u1","published":{"generation":"x"}}`))
	f.Add("", []byte(`null`))
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		rec, ok := reconciler.ParseRecord(key, value)
		if !ok {
			return
		}
		if string(rec.UID) != key {
			t.Fatalf("the record under %q names uid %q", key, rec.UID)
		}
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatalf("an accepted record does not encode: %v", err)
		}
		if _, ok := reconciler.ParseRecord(key, b); !ok {
			t.Fatalf("an accepted record, written again, is refused:\n%s", b)
		}
	})
}
