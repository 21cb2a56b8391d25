// Package watchjson decodes the API server's JSON for a list and watch of
// one kind with two passes over each object fewer than client-go's JSON
// serializer makes.
//
// That serializer reads every document twice before decoding it: once to
// find its apiVersion and kind (encoding/json into a two-field struct,
// which validates and walks the whole document), and, in a watch stream,
// once more for the event's envelope ({"type":..,"object":{..}}), whose
// object is the whole Student again. For a watch of one kind both passes
// are spent on documents whose shape the API server fixes. Here:
//
//   - kindFinder finds apiVersion and kind with a scan that only skips
//     the other members' values;
//   - eventDecoder takes the envelope's type and object apart the same
//     way.
//
// The Student itself is decoded by apimachinery's JSON serializer exactly
// as before (it validates the document in full). Anything these readers do
// not expect (an escape in a key, a non-ASCII name, members in another
// order) goes to apimachinery's own code, so the results are the same for
// every valid document: the fuzz tests compare them.
package watchjson

import (
	"bytes"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
)

// kindFinder is a json.MetaFactory: the apiVersion and kind of a document,
// as json.SimpleMetaFactory finds them, without decoding the document.
type kindFinder struct{}

var _ json.MetaFactory = kindFinder{}

func (kindFinder) Interpret(data []byte) (*schema.GroupVersionKind, error) {
	apiVersion, kind, ok := findKind(data)
	if !ok {
		return json.DefaultMetaFactory.Interpret(data)
	}
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return nil, err
	}
	return &schema.GroupVersionKind{Group: gv.Group, Version: gv.Version, Kind: kind}, nil
}

// findKind reads the top-level members apiVersion and kind of the JSON
// object data, as encoding/json does into a struct with those two fields:
// a key matches whatever its case, the last of duplicate members wins, and
// null leaves a field as it was. ok is false where that takes more than
// this scan knows (a key with an escape or a non-ASCII byte, a value that
// is neither a plain ASCII string nor null, data that is not an object):
// the caller then asks encoding/json. The scan does not validate what it
// skips; a document that is not valid JSON fails the decoding that
// follows.
func findKind(data []byte) (apiVersion, kind string, ok bool) {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return "", "", false
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return "", "", true
	}
	for i < len(data) {
		key, value, isMember := member(data, i)
		if !isMember {
			return "", "", false
		}
		i = value
		var field *string
		switch {
		case bytes.EqualFold(key, []byte("apiVersion")):
			field = &apiVersion
		case bytes.EqualFold(key, []byte("kind")):
			field = &kind
		}
		if field == nil {
			if i, ok = skipValue(data, i); !ok {
				return "", "", false
			}
		} else if bytes.HasPrefix(data[i:], []byte("null")) {
			i += len("null")
		} else {
			value, next, plain := plainString(data, i)
			if !plain {
				return "", "", false
			}
			*field, i = string(value), next
		}
		i = skipSpace(data, i)
		if i >= len(data) {
			return "", "", false
		}
		switch data[i] {
		case '}':
			return apiVersion, kind, true
		case ',':
			i = skipSpace(data, i+1)
		default:
			return "", "", false
		}
	}
	return "", "", false
}

// eventDecoder decodes a watch stream's frames into metav1.WatchEvent
// without decoding the event's object: client-go decodes that next, with
// the embedded decoder. A frame of another shape goes to the JSON
// serializer it wraps, as do decodings into anything but a WatchEvent.
type eventDecoder struct {
	runtime.Serializer
	gvk schema.GroupVersionKind // a WatchEvent's, as the serializer reports it
}

func (d eventDecoder) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	ev, isEvent := into.(*metav1.WatchEvent)
	if !isEvent || defaults != nil {
		return d.Serializer.Decode(data, defaults, into)
	}
	typ, object, ok := splitEvent(data)
	if !ok {
		return d.Serializer.Decode(data, defaults, into)
	}
	ev.Type = typ
	// The frame's buffer is the stream decoder's, read into again for the
	// next event: the object is copied, as encoding/json copies it.
	ev.Object = runtime.RawExtension{Raw: bytes.Clone(object)}
	gvk := d.gvk
	return ev, &gvk, nil
}

// splitEvent takes apart a watch event as the API server writes it,
// {"type":"<type>","object":<object>}, and returns its type and the
// bytes of its object. ok is false for any other shape (other members,
// another order, an escape in the type, a null object).
func splitEvent(data []byte) (typ string, object []byte, ok bool) {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return "", nil, false
	}
	if i, ok = named(data, i+1, "type"); !ok {
		return "", nil, false
	}
	t, i, ok := plainString(data, i)
	if !ok {
		return "", nil, false
	}
	i = skipSpace(data, i)
	if i >= len(data) || data[i] != ',' {
		return "", nil, false
	}
	if i, ok = named(data, i+1, "object"); !ok {
		return "", nil, false
	}
	end, ok := skipValue(data, i)
	if !ok || bytes.Equal(data[i:end], []byte("null")) {
		return "", nil, false
	}
	j := skipSpace(data, end)
	if j >= len(data) || data[j] != '}' || skipSpace(data, j+1) != len(data) {
		return "", nil, false
	}
	return string(t), data[i:end], true
}

// member reads a member's `"<key>":` from data at i (space allowed
// around each token), the key a plainString, and returns the key and the
// index of the member's value.
func member(data []byte, i int) (key []byte, value int, ok bool) {
	key, i, ok = plainString(data, skipSpace(data, i))
	if !ok {
		return nil, 0, false
	}
	i = skipSpace(data, i)
	if i >= len(data) || data[i] != ':' {
		return nil, 0, false
	}
	return key, skipSpace(data, i+1), true
}

// named is member for a member whose key must be name.
func named(data []byte, i int, name string) (int, bool) {
	key, value, ok := member(data, i)
	return value, ok && string(key) == name
}

// plainString reads the JSON string at data[i] when it is printable ASCII
// without escapes, and returns its contents and the index after it.
func plainString(data []byte, i int) (s []byte, next int, ok bool) {
	if i >= len(data) || data[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(data); j++ {
		switch c := data[j]; {
		case c == '"':
			return data[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20 || c > 0x7e:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// skipValue returns the index after the JSON value at data[i], without
// validating it: strings are skipped to their closing quote, objects and
// arrays to their matching bracket, anything else to the next delimiter.
func skipValue(data []byte, i int) (int, bool) {
	if i >= len(data) {
		return 0, false
	}
	switch data[i] {
	case '"':
		return skipString(data, i)
	case '{', '[':
		depth := 0
		for i < len(data) {
			switch data[i] {
			case '"':
				var ok bool
				if i, ok = skipString(data, i); !ok {
					return 0, false
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1, true
				}
			}
			i++
		}
		return 0, false
	default:
		j := i
		for j < len(data) && !delimiter(data[j]) {
			j++
		}
		return j, j > i
	}
}

// skipString returns the index after the JSON string at data[i].
func skipString(data []byte, i int) (int, bool) {
	for j := i + 1; j < len(data); {
		k := bytes.IndexAny(data[j:], `"\`)
		if k < 0 {
			return 0, false
		}
		j += k
		if data[j] == '"' {
			return j + 1, true
		}
		j += 2 // an escape: the next byte is never the closing quote
	}
	return 0, false
}

// delimiter reports whether c ends a number or a literal.
func delimiter(c byte) bool {
	switch c {
	case ',', '}', ']', ' ', '\t', '\r', '\n':
		return true
	}
	return false
}

func skipSpace(data []byte, i int) int {
	for i < len(data) {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// serializer is a runtime.NegotiatedSerializer for JSON alone.
type serializer struct {
	scheme *runtime.Scheme
	info   runtime.SerializerInfo
}

// NewSerializer is a runtime.NegotiatedSerializer for JSON alone, for a
// REST client's requests (rest.Config's NegotiatedSerializer): it decodes
// with kindFinder and, in a watch stream, eventDecoder, and objects as
// the API server sends them, without conversion, as controller-runtime's
// clients do. s must hold the kinds decoded and metav1's types.
func NewSerializer(s *runtime.Scheme) (runtime.NegotiatedSerializer, error) {
	js := json.NewSerializerWithOptions(kindFinder{}, s, s, json.SerializerOptions{})
	kinds, _, err := s.ObjectKinds(&metav1.WatchEvent{})
	if err != nil {
		return nil, fmt.Errorf("watchjson: the scheme has no watch events: %w", err)
	}
	events := eventDecoder{Serializer: js, gvk: kinds[0]}
	return serializer{scheme: s, info: runtime.SerializerInfo{
		MediaType:        runtime.ContentTypeJSON,
		MediaTypeType:    "application",
		MediaTypeSubType: "json",
		EncodesAsText:    true,
		Serializer:       js,
		StreamSerializer: &runtime.StreamSerializerInfo{EncodesAsText: true, Serializer: events, Framer: json.Framer},
	}}, nil
}

func (s serializer) SupportedMediaTypes() []runtime.SerializerInfo {
	return []runtime.SerializerInfo{s.info}
}

func (s serializer) EncoderForVersion(e runtime.Encoder, gv runtime.GroupVersioner) runtime.Encoder {
	return runtime.WithVersionEncoder{Version: gv, Encoder: e, ObjectTyper: s.scheme}
}

func (s serializer) DecoderToVersion(d runtime.Decoder, _ runtime.GroupVersioner) runtime.Decoder {
	return runtime.WithoutVersionDecoder{Decoder: d}
}
