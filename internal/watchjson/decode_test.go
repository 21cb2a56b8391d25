package watchjson

import (
	"bytes"
	encjson "encoding/json"
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	codecs "k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"

	"github.com/student-bridge/student-bridge/internal/scheme"
)

// student is a Student as the API server writes it in a watch event.
const student = `{"apiVersion":"example.k8s.io/v1","kind":"Student","metadata":{"creationTimestamp":"2026-12-07T04:10:48Z",` +
	`"finalizers":["example.k8s.io/student-bridge"],"generation":3,"managedFields":[{"apiVersion":"example.k8s.io/v1",` +
	`"fieldsType":"FieldsV1","fieldsV1":{"f:spec":{".":{},"f:name":{},"f:school":{}}},"manager":"kubectl",` +
	`"operation":"Update","time":"2026-12-07T04:10:48Z"},{"apiVersion":"example.k8s.io/v1","fieldsType":"FieldsV1",` +
	`"fieldsV1":{"f:metadata":{"f:finalizers":{".":{},"v:\"example.k8s.io/student-bridge\"":{}}}},` +
	`"manager":"student-bridge","operation":"Update","time":"2026-12-07T04:10:48Z"}],"name":"wang","namespace":"school-1",` +
	`"resourceVersion":"123456","uid":"6f1c8a4e-1b2c-4d3e-9f00-0123456789ab"},"spec":{"name":"王","school":"清华"}}`

func kindSeeds(f *testing.F) {
	for _, s := range []string{
		student,
		`{"kind":"StudentList","apiVersion":"example.k8s.io/v1","items":[` + student + `]}`,
		`{"type":"MODIFIED","object":` + student + `}`,
		`{}`, ` { "apiVersion" : "v1" , "kind" : "Status" } `, `null`, `[]`, `"x"`,
		`{"KIND":"A","Kind":"B","apiversion":"g/v"}`, `{"kind":"A","kind":null}`, `{"kind":1}`,
		`{"kind":"\u0041"}`, `{"\u006bind":"A"}`, `{"kind":"Ä"}`, `{"apiVersion":"a/b/c"}`,
		`{"a":[1,{"kind":"inner"}],"b":"\"}","c":true,"kind":"K"}`,
	} {
		f.Add([]byte(s))
	}
}

// FuzzFindKind: for every valid JSON document, kindFinder finds what
// apimachinery's SimpleMetaFactory finds, or fails where it fails.
func FuzzFindKind(f *testing.F) {
	kindSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		got, gotErr := kindFinder{}.Interpret(data)
		if !encjson.Valid(data) {
			return
		}
		want, wantErr := json.DefaultMetaFactory.Interpret(data)
		if (gotErr != nil) != (wantErr != nil) || !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: got %v (%v), SimpleMetaFactory %v (%v)", data, got, gotErr, want, wantErr)
		}
	})
}

// FuzzDecodeEvent: for every valid JSON frame, eventDecoder decodes a
// watch event as apimachinery's JSON serializer does.
func FuzzDecodeEvent(f *testing.F) {
	kindSeeds(f)
	for _, s := range []string{
		`{"type":"ADDED","object":{"kind":"Student"}}`, `{"type":"BOOKMARK","object":null}`,
		`{"type":"DELETED","object":1} `, `{"object":{},"type":"ADDED"}`, `{"type":"A","object":{},"type":"B"}`,
		`{"type":"ERROR" , "object" : {"kind":"Status","code":410}}`, `{"type":"\u0041","object":{}}`,
	} {
		f.Add([]byte(s))
	}
	s := scheme.New()
	js := json.NewSerializerWithOptions(json.DefaultMetaFactory, s, s, json.SerializerOptions{})
	ns, err := NewSerializer(s)
	if err != nil {
		f.Fatal(err)
	}
	events := ns.SupportedMediaTypes()[0].StreamSerializer.Serializer
	f.Fuzz(func(t *testing.T, data []byte) {
		var got, want metav1.WatchEvent
		_, _, gotErr := events.Decode(data, nil, &got)
		if !encjson.Valid(data) {
			return
		}
		_, _, wantErr := js.Decode(data, nil, &want)
		if (gotErr != nil) != (wantErr != nil) || !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: got %+v (%v), the JSON serializer %+v (%v)", data, got, gotErr, want, wantErr)
		}
	})
}

// frame is one watch event as the API server streams it.
var frame = []byte(`{"type":"MODIFIED","object":` + student + "}\n")

// BenchmarkDecodeEvent decodes one watch event of a Student, frame and
// object, as client-go does: with controller-runtime's serializer
// (apimachinery's JSON serializer), and with this package's.
func BenchmarkDecodeEvent(b *testing.B) {
	s := scheme.New()
	ours, err := NewSerializer(s)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		ns   runtime.NegotiatedSerializer
	}{
		{"apimachinery", codecs.WithoutConversionCodecFactory{CodecFactory: codecs.NewCodecFactory(s)}},
		{"watchjson", ours},
	} {
		b.Run(c.name, func(b *testing.B) {
			dec := watchDecoder(b, c.ns)
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := dec(frame); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// watchDecoder decodes one frame as a watch's decoder in client-go does:
// the frame with the stream serializer into a WatchEvent, then its object
// with the serializer, into nothing.
func watchDecoder(tb testing.TB, ns runtime.NegotiatedSerializer) func([]byte) (string, runtime.Object, error) {
	info, ok := runtime.SerializerInfoForMediaType(ns.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok || info.StreamSerializer == nil {
		tb.Fatal("no JSON stream serializer")
	}
	objects := ns.DecoderToVersion(info.Serializer, nil)
	return func(data []byte) (string, runtime.Object, error) {
		var ev metav1.WatchEvent
		if _, _, err := info.StreamSerializer.Serializer.Decode(bytes.TrimSpace(data), nil, &ev); err != nil {
			return "", nil, err
		}
		obj, err := runtime.Decode(objects, ev.Object.Raw)
		return ev.Type, obj, err
	}
}
