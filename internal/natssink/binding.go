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
// the data in the body. The reading half is the public consumer.DecodeMsg.

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
