package consumer

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// fuzzMsg is a message of the stream as decode reads it.
type fuzzMsg struct {
	jetstream.Msg
	subject string
	header  nats.Header
	data    []byte
}

func (m fuzzMsg) Subject() string      { return m.subject }
func (m fuzzMsg) Headers() nats.Header { return m.header }
func (m fuzzMsg) Data() []byte         { return m.data }

// FuzzDecode: whatever is published on a Student subject, in either
// encoding (binary mode's ce- headers included), decode returns a Student
// event with a uid, or an error the Mirror skips; never a panic.
func FuzzDecode(f *testing.F) {
	structured := `{"specversion":"1.0","id":"e1","type":"io.k8s.example.student.created","source":"/clusters/default/apis/example.k8s.io/v1/students","sequence":"00000000000000000001","datacontenttype":"application/json","data":{"metadata":{"namespace":"default","name":"wang","uid":"u1","generation":1},"spec":{"name":"wang","school":"china"}}}`
	f.Add("application/cloudevents+json", "", "", "", "", []byte(structured))
	f.Add("application/json", "1.0", "e1", "io.k8s.example.student.updated", "/clusters/west/apis/example.k8s.io/v1/students", []byte(`{"metadata":{"uid":"u1"},"spec":{}}`))
	f.Add("application/json", "1.0", "e1", "io.k8s.example.student.updated", "/x", []byte(`{"metadata":{}}`))
	f.Add("", "0.3", "", "", "", []byte(`{`))
	f.Add("text/plain", "1.0", "e", "t", "s", []byte("\xff"))
	f.Fuzz(func(t *testing.T, contentType, specversion, id, typ, source string, data []byte) {
		h := nats.Header{}
		if contentType != "" {
			h.Set("Content-Type", contentType)
		}
		for k, v := range map[string]string{"ce-specversion": specversion, "ce-id": id, "ce-type": typ, "ce-source": source} {
			if v != "" {
				h.Set(k, v)
			}
		}
		ev, err := decode(fuzzMsg{subject: "student.updated", header: h, data: data})
		if err != nil {
			return
		}
		if ev.data.Metadata.UID == "" {
			t.Fatalf("decoded an event that names no Student: %+v", ev)
		}
		if ev.desired(1).UID != ev.data.Metadata.UID {
			t.Fatal("the desired state names another Student")
		}
	})
}
