package consumer

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/nats-io/nats.go"
)

// This file reads the CloudEvents NATS protocol binding on top of the
// sdk-go binding package, in both of its modes: structured (the JSON event
// in the body, Content-Type application/cloudevents+json) and binary (each
// attribute in a ce-<name> header, the data in the body). It also accepts
// datacontenttype in a Content-Type header, as older writers send it.

const (
	headerContentType = "Content-Type"
	headerPrefix      = "ce-"
)

var specs = spec.WithPrefix(headerPrefix)

// newMessage wraps a received NATS message as an sdk-go binding.Message, in
// either encoding; binding.ToEvent turns it into a cloudevents.Event.
func newMessage(msg *nats.Msg) binding.Message {
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

// DecodeMsg decodes a NATS message the bridge published (either mode of the
// CloudEvents NATS binding) into a CloudEvent, and checks that it is a
// valid one. A JetStream message is decoded as
// DecodeMsg(ctx, &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}).
func DecodeMsg(ctx context.Context, msg *nats.Msg) (*cloudevents.Event, error) {
	ev, err := binding.ToEvent(ctx, newMessage(msg))
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
