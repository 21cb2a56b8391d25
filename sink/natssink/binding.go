package natssink

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/textproto"
	"strings"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/nats-io/nats.go"
)

// This file implements the CloudEvents NATS protocol binding on top of the
// sdk-go binding package: structured mode puts the JSON event in the body with
// Content-Type application/cloudevents+json; binary mode puts each attribute,
// datacontenttype included (ce-datacontenttype, as the binding spec has said
// since 1.0.3 and sdk-go's NATS bindings read it), in a ce-<name> header and
// the data in the body. Decoding also accepts datacontenttype in a
// Content-Type header, as older writers send it.

// Encoding selects how an event is laid out in a NATS message.
type Encoding string

const (
	// Structured puts the whole event as JSON in the message body (default).
	Structured Encoding = "structured"
	// Binary puts the attributes in ce-* headers, the data in the body.
	Binary Encoding = "binary"
)

const (
	headerContentType = "Content-Type"
	headerPrefix      = "ce-"
)

var specs = spec.WithPrefix(headerPrefix)

// EncodeMsg writes the event into a new NATS message on subject.
func EncodeMsg(ctx context.Context, event cloudevents.Event, subject string, enc Encoding) (*nats.Msg, error) {
	msg := nats.NewMsg(subject)
	w := (*msgWriter)(msg)
	switch enc {
	case Binary:
		ctx = binding.WithForceBinary(ctx)
	case Structured, "":
		ctx = binding.WithForceStructured(ctx)
	default:
		return nil, fmt.Errorf("unknown encoding %q", enc)
	}
	if _, err := binding.Write(ctx, binding.ToMessage(&event), w, w); err != nil {
		return nil, fmt.Errorf("encode event %s: %w", event.ID(), err)
	}
	return msg, nil
}

// NewMessage wraps a received NATS message as an sdk-go binding.Message, in
// either encoding; binding.ToEvent turns it into a cloudevents.Event.
func NewMessage(msg *nats.Msg) binding.Message {
	m := &message{msg: msg}
	if f := format.Lookup(headerValue(msg.Header, headerContentType)); f != nil {
		m.format = f
	} else if v := headerValue(msg.Header, specs.PrefixedSpecVersionName()); v != "" {
		m.version = specs.Version(v)
	}
	return m
}

// headerValue looks key up case-insensitively: NATS headers are
// case-sensitive, but a proxy or another client library may canonicalize
// them (Ce-Specversion).
func headerValue(h nats.Header, key string) string {
	if v := h.Get(key); v != "" {
		return v
	}
	for k, vs := range h {
		if strings.EqualFold(k, key) && len(vs) > 0 {
			return vs[0]
		}
	}
	return ""
}

// DecodeMsg decodes a received NATS message into a CloudEvent.
func DecodeMsg(ctx context.Context, msg *nats.Msg) (*cloudevents.Event, error) {
	ev, err := binding.ToEvent(ctx, NewMessage(msg))
	if err != nil {
		return nil, fmt.Errorf("decode message on %s: %w", msg.Subject, err)
	}
	// The binding takes binary mode's attributes as they come (a
	// Content-Type that is no media type, say): what it returns must be a
	// CloudEvent all the same.
	if err := ev.Validate(); err != nil {
		return nil, fmt.Errorf("decode message on %s: not a valid CloudEvent: %w", msg.Subject, err)
	}
	return ev, nil
}

type msgWriter nats.Msg

func (w *msgWriter) SetStructuredEvent(_ context.Context, f format.Format, event io.Reader) error {
	w.Header.Set(headerContentType, f.MediaType())
	return w.setBody(event)
}

func (w *msgWriter) Start(context.Context) error { return nil }
func (w *msgWriter) End(context.Context) error   { return nil }

func (w *msgWriter) SetData(data io.Reader) error { return w.setBody(data) }

func (w *msgWriter) SetAttribute(attr spec.Attribute, value any) error {
	if value == nil {
		return nil
	}
	return w.setHeader(attr.Name(), value)
}

func (w *msgWriter) SetExtension(name string, value any) error {
	if value == nil {
		return nil
	}
	return w.setHeader(name, value)
}

// setHeader writes one attribute as its ce- header. nats.go trims a header
// value's surrounding white space and turns CR and LF into spaces when it
// writes the message, so a value it would change is refused here: binary mode
// carries an event unchanged or not at all (structured mode carries any).
func (w *msgWriter) setHeader(name string, value any) error {
	s, err := types.Format(value)
	if err != nil {
		return err
	}
	if s != textproto.TrimString(s) || strings.ContainsAny(s, "\r\n") {
		return fmt.Errorf("attribute %s (%q) cannot travel in a NATS header unchanged; use structured mode", name, s)
	}
	w.Header.Set(headerPrefix+name, s)
	return nil
}

func (w *msgWriter) setBody(r io.Reader) error {
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(r); err != nil {
		return err
	}
	w.Data = buf.Bytes()
	return nil
}

type message struct {
	msg     *nats.Msg
	format  format.Format
	version spec.Version
}

var (
	_ binding.Message               = (*message)(nil)
	_ binding.MessageMetadataReader = (*message)(nil)
)

// GetAttribute implements binding.MessageMetadataReader for binary messages.
func (m *message) GetAttribute(k spec.Kind) (spec.Attribute, any) {
	if m.version == nil {
		return nil, nil
	}
	attr := m.version.AttributeFromKind(k)
	if attr == nil {
		return nil, nil
	}
	v := headerValue(m.msg.Header, headerPrefix+attr.Name())
	if v == "" && k == spec.DataContentType {
		v = headerValue(m.msg.Header, headerContentType)
	}
	if v != "" {
		return attr, v
	}
	return attr, nil
}

// GetExtension implements binding.MessageMetadataReader for binary messages.
func (m *message) GetExtension(name string) any {
	if v := headerValue(m.msg.Header, headerPrefix+name); v != "" {
		return v
	}
	return nil
}

func (m *message) ReadEncoding() binding.Encoding {
	switch {
	case m.version != nil:
		return binding.EncodingBinary
	case m.format != nil:
		return binding.EncodingStructured
	default:
		return binding.EncodingUnknown
	}
}

func (m *message) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	if m.format == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, m.format, bytes.NewReader(m.msg.Data))
}

func (m *message) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	if m.version == nil {
		return binding.ErrNotBinary
	}
	for key, values := range m.msg.Header {
		if len(values) == 0 {
			continue
		}
		var err error
		lower := strings.ToLower(key)
		switch {
		case lower == strings.ToLower(headerContentType):
			err = w.SetAttribute(m.version.AttributeFromKind(spec.DataContentType), values[0])
		case m.version.Attribute(lower) != nil:
			err = w.SetAttribute(m.version.Attribute(lower), values[0])
		case strings.HasPrefix(lower, headerPrefix):
			err = w.SetExtension(strings.TrimPrefix(lower, headerPrefix), values[0])
		}
		if err != nil {
			return err
		}
	}
	if len(m.msg.Data) > 0 {
		return w.SetData(bytes.NewReader(m.msg.Data))
	}
	return nil
}

func (m *message) Finish(error) error { return nil }
