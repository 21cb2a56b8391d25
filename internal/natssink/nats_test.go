//go:build !nostack

package natssink_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	cejetstream "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/student-bridge/student-bridge/consumer"
	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/sink"
)

func testEvent(t *testing.T, typ, id string, data any) cloudevents.Event {
	t.Helper()
	ev := cloudevents.NewEvent()
	ev.SetID(id)
	ev.SetType(typ)
	ev.SetSource("/clusters/test/apis/example.k8s.io/v1/students")
	ev.SetSubject("default/object-name")
	ev.SetTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	ev.SetExtension("tenant", "blue")
	if err := ev.SetData(cloudevents.ApplicationJSON, data); err != nil {
		t.Fatal(err)
	}
	return ev
}

// TestEncodingRoundTrip: both binding modes decode to the event that was
// encoded, datacontenttype included, with this package's decoder and with
// sdk-go's own NATS JetStream binding, as a consumer in Go would.
func TestEncodingRoundTrip(t *testing.T) {
	ev := testEvent(t, "io.k8s.example.student.created", "id-1", map[string]string{"name": "wang"})
	for _, enc := range []natssink.Encoding{natssink.Structured, natssink.Binary} {
		t.Run(string(enc), func(t *testing.T) {
			msg, err := natssink.EncodeMsg(context.Background(), ev, "student.created", enc)
			if err != nil {
				t.Fatal(err)
			}
			switch enc {
			case natssink.Structured:
				if msg.Header.Get("Content-Type") != "application/cloudevents+json" || !strings.Contains(string(msg.Data), `"specversion":"1.0"`) {
					t.Errorf("structured message: %v %s", msg.Header, msg.Data)
				}
			case natssink.Binary:
				if msg.Header.Get("ce-id") != "id-1" || msg.Header.Get("ce-tenant") != "blue" || msg.Header.Get("ce-datacontenttype") != "application/json" || string(msg.Data) != `{"name":"wang"}` {
					t.Errorf("binary message: %v %s", msg.Header, msg.Data)
				}
			}
			got, err := consumer.DecodeMsg(context.Background(), msg)
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != ev.String() {
				t.Errorf("decoded\n%s\nwant\n%s", got, ev)
			}
			sdk, err := binding.ToEvent(context.Background(), cejetstream.NewMessage(msg))
			if err != nil {
				t.Fatalf("sdk-go nats_jetstream binding: %v", err)
			}
			if sdk.String() != ev.String() || sdk.DataContentType() != cloudevents.ApplicationJSON {
				t.Errorf("sdk-go nats_jetstream binding decoded\n%s\nwant\n%s", sdk, ev)
			}
		})
	}
}

func TestDecodeRejectsNonCloudEvents(t *testing.T) {
	_, err := consumer.DecodeMsg(context.Background(), &nats.Msg{Subject: "x", Data: []byte("hello")})
	if err == nil {
		t.Fatal("decoded a plain message")
	}
}

func TestDecodeCanonicalizedHeaders(t *testing.T) {
	msg := &nats.Msg{Subject: "x", Header: nats.Header{
		"Ce-Specversion": {"1.0"}, "Ce-Id": {"a"}, "Ce-Type": {"t"}, "Ce-Source": {"/s"}, "Content-Type": {"application/json"},
	}, Data: []byte(`{}`)}
	ev, err := consumer.DecodeMsg(context.Background(), msg)
	if err != nil {
		t.Fatal(err)
	}
	if ev.ID() != "a" || ev.Type() != "t" || ev.Source() != "/s" || ev.DataContentType() != "application/json" {
		t.Errorf("decoded %s", ev)
	}
}

func TestSubjectLayout(t *testing.T) {
	ev := testEvent(t, "io.k8s.example.student.updated", "x", nil)
	ev.SetSubject("team.a/wang.wei")
	cases := []struct {
		prefix, layout, want, err string
	}{
		{"student", natssink.DefaultSubjectLayout, "student.updated", ""},
		{"corp.student", "{prefix}.{namespace}.{op}", "corp.student.team_a.updated", ""},
		{"student", "{prefix}.{op}.{namespace}.{name}", "student.updated.team_a.wang_wei", ""},
		{"student", "{prefix}.v1.{name}-{op}", "student.v1.wang_wei-updated", ""},
		{"student", "{op}.{prefix}", "", "must start"},
		{"student", "{prefix}.{name}", "", "must contain {op}"},
		{"student", "{prefix}.{op}.{uid}", "", "unknown token"},
		{"student", "{prefix}.{op}.*", "", "wildcard"},
		{"stu dent", "{prefix}.{op}", "", "not a valid"},
		{"student.", "{prefix}.{op}", "", "not a valid"},
		{"", "{prefix}.{op}", "", "not a valid"},
	}
	for _, tc := range cases {
		l, err := natssink.NewSubjectLayout(tc.prefix, tc.layout)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q %q: err %v, want %q", tc.prefix, tc.layout, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q %q: %v", tc.prefix, tc.layout, err)
			continue
		}
		if got := l.Subject(ev); got != tc.want {
			t.Errorf("%q %q: subject %q, want %q", tc.prefix, tc.layout, got, tc.want)
		}
		if !natssink.SubjectCovers(l.StreamSubject(), l.Subject(ev)) {
			t.Errorf("stream subject %s does not cover %s", l.StreamSubject(), l.Subject(ev))
		}
	}
}

func TestSubjectCovers(t *testing.T) {
	cases := []struct {
		filter, sub string
		want        bool
	}{
		{"student.>", "student.>", true},
		{"student.>", "student.created", true},
		{">", "student.>", true},
		{"*.>", "student.>", true},
		{"student.*", "student.>", false},
		{"student.created", "student.>", false},
		{"student", "student.>", false},
		{"students.>", "student.>", false},
		{"student.*", "student.created", true},
		{"student.*", "student.*", true},
		{"student.created", "student.*", false},
		{"student.>", "student", false},
	}
	for _, tc := range cases {
		if got := natssink.SubjectCovers(tc.filter, tc.sub); got != tc.want {
			t.Errorf("SubjectCovers(%q, %q) = %v, want %v", tc.filter, tc.sub, got, tc.want)
		}
	}
}

// server starts an embedded NATS server for one test.
func server(t *testing.T, configure func(*natsserver.Options)) (*stack.NATS, *nats.Conn) {
	t.Helper()
	n, err := stack.StartNATS(stack.NATSOptions{Configure: configure})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	nc, err := nats.Connect(n.URL(), nats.ReconnectBufSize(-1), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return n, nc
}

func ensure(t *testing.T, nc *nats.Conn, cfg natssink.StreamConfig) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := natssink.EnsureStream(context.Background(), js, cfg, true); err != nil {
		t.Fatal(err)
	}
	return js
}

func layout(t *testing.T) natssink.SubjectLayout {
	l, err := natssink.NewSubjectLayout("student", natssink.DefaultSubjectLayout)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestPublishAckAndDuplicate(t *testing.T) {
	ctx := context.Background()
	_, nc := server(t, nil)
	js := ensure(t, nc, natssink.StreamConfig{Name: "STUDENTS", Subject: "student.>", Duplicates: time.Minute, Storage: "memory", Replicas: 1})
	p, err := natssink.NewPublisher(nc, natssink.Config{Layout: layout(t), Stream: "STUDENTS"})
	if err != nil {
		t.Fatal(err)
	}
	ev := testEvent(t, "io.k8s.example.student.created", "same-id", map[string]string{"a": "b"})
	r1, err := p.Publish(ctx, ev)
	if err != nil {
		t.Fatal(err)
	}
	if r1.Stream != "STUDENTS" || r1.Sequence != 1 || r1.Duplicate || r1.Subject != "student.created" {
		t.Errorf("first receipt %+v", r1)
	}
	r2, err := p.Publish(ctx, ev)
	if err != nil {
		t.Fatal(err)
	}
	if !r2.Duplicate || r2.Sequence != 1 {
		t.Errorf("republished event not reported as duplicate: %+v", r2)
	}
	s, _ := js.Stream(ctx, "STUDENTS")
	info, _ := s.Info(ctx)
	if info.State.Msgs != 1 {
		t.Errorf("stream holds %d messages, want 1", info.State.Msgs)
	}
}

// TestPublishEncodedIsPublish: an event published with its JSON already
// encoded is stored as Publish stores it, byte for byte, in both
// encodings (the binary one encodes it itself).
func TestPublishEncodedIsPublish(t *testing.T) {
	ctx := context.Background()
	_, nc := server(t, nil)
	js := ensure(t, nc, natssink.StreamConfig{Name: "STUDENTS", Subject: "student.>", Duplicates: time.Minute, Storage: "memory", Replicas: 1})
	stream, err := js.Stream(ctx, "STUDENTS")
	if err != nil {
		t.Fatal(err)
	}
	for i, enc := range []natssink.Encoding{natssink.Structured, natssink.Binary} {
		p, err := natssink.NewPublisher(nc, natssink.Config{Layout: layout(t), Stream: "STUDENTS", Encoding: enc})
		if err != nil {
			t.Fatal(err)
		}
		ev := testEvent(t, "io.k8s.example.student.created", fmt.Sprint("id-", i), map[string]string{"name": "wang"})
		encoded, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		r, err := p.PublishEncoded(ctx, ev, encoded)
		if err != nil {
			t.Fatal(err)
		}
		got, err := stream.GetMsg(ctx, r.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		want, err := natssink.EncodeMsg(ctx, ev, r.Subject, enc)
		if err != nil {
			t.Fatal(err)
		}
		if string(got.Data) != string(want.Data) {
			t.Errorf("%s: stored\n%s\nwant\n%s", enc, got.Data, want.Data)
		}
		for k := range want.Header {
			if got.Header.Get(k) != want.Header.Get(k) {
				t.Errorf("%s: header %s is %q, want %q", enc, k, got.Header.Get(k), want.Header.Get(k))
			}
		}
	}
}

func TestPublishErrors(t *testing.T) {
	ctx := context.Background()
	n, nc := server(t, func(o *natsserver.Options) { o.MaxPayload = 4096 })
	ensure(t, nc, natssink.StreamConfig{Name: "SMALL", Subject: "student.>", Duplicates: time.Minute, Storage: "memory", Replicas: 1, MaxMsgs: 1, Discard: "new"})
	p, err := natssink.NewPublisher(nc, natssink.Config{Layout: layout(t), AckTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}

	big := testEvent(t, "io.k8s.example.student.created", "big", map[string]string{"a": strings.Repeat("x", 5000)})
	if _, err := p.Publish(ctx, big); !errors.Is(err, sink.ErrTooLarge) {
		t.Errorf("oversized event: err %v, want ErrTooLarge", err)
	}

	if _, err := p.Publish(ctx, testEvent(t, "io.k8s.example.student.created", "one", nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Publish(ctx, testEvent(t, "io.k8s.example.student.created", "two", nil)); !errors.Is(err, sink.ErrRejected) {
		t.Errorf("full stream with discard new: err %v, want ErrRejected", err)
	}

	n.Shutdown()
	if _, err := p.Publish(ctx, testEvent(t, "io.k8s.example.student.created", "three", nil)); !errors.Is(err, sink.ErrNotConnected) {
		t.Errorf("server down: err %v, want ErrNotConnected", err)
	}
	nc.Close()
	if _, err := p.Publish(ctx, testEvent(t, "io.k8s.example.student.created", "four", nil)); !errors.Is(err, sink.ErrClosed) {
		t.Errorf("closed connection: err %v, want ErrClosed", err)
	}
}

// TestPublishWithoutStreamIsRejected: a publish no stream answers is a
// rejection when JetStream says no stream captures the subject. Asked once,
// that answer stands for the failures that follow (one request for an
// outage, not one per failed publish).
func TestPublishWithoutStreamIsRejected(t *testing.T) {
	_, nc := server(t, nil)
	p, err := natssink.NewPublisher(nc, natssink.Config{Layout: layout(t), AckTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// What JetStream is asked, as the server sees it.
	lookups, err := nc.SubscribeSync("$JS.API.STREAM.NAMES")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		_, err = p.Publish(context.Background(), testEvent(t, "io.k8s.example.student.created", fmt.Sprint("x", i), nil))
		if !errors.Is(err, sink.ErrRejected) {
			t.Errorf("no stream: err %v, want ErrRejected", err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := lookups.Pending(); n != 1 {
		t.Errorf("five publishes no stream answered asked JetStream %d times which stream captures the subject, want once", n)
	}
}

func TestCoreMode(t *testing.T) {
	_, nc := server(t, nil)
	sub, err := nc.SubscribeSync("student.*")
	if err != nil {
		t.Fatal(err)
	}
	p, err := natssink.NewPublisher(nc, natssink.Config{Layout: layout(t), Mode: natssink.Core, Encoding: natssink.Binary})
	if err != nil {
		t.Fatal(err)
	}
	r, err := p.Publish(context.Background(), testEvent(t, "io.k8s.example.student.deleted", "c", nil))
	if err != nil {
		t.Fatal(err)
	}
	if r.Stream != "" || r.Sequence != 0 || r.Subject != "student.deleted" {
		t.Errorf("core receipt %+v", r)
	}
	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Header.Get("ce-id") != "c" {
		t.Errorf("got %v", msg.Header)
	}
}

func TestEnsureStreamNeverChangesAnExistingStream(t *testing.T) {
	ctx := context.Background()
	_, nc := server(t, nil)
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "STUDENTS", Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	_, err := natssink.EnsureStream(ctx, js, natssink.StreamConfig{Name: "STUDENTS", Subject: "student.>", Duplicates: time.Minute}, true)
	if !errors.Is(err, natssink.ErrStreamConflict) || !strings.Contains(err.Error(), "other.>") {
		t.Errorf("err %v, want ErrStreamConflict naming the stream's subjects", err)
	}
	s, _ := js.Stream(ctx, "STUDENTS")
	if got := s.CachedInfo().Config.Subjects; len(got) != 1 || got[0] != "other.>" {
		t.Errorf("stream subjects changed to %v", got)
	}

	_, err = natssink.EnsureStream(ctx, js, natssink.StreamConfig{Name: "MISSING", Subject: "x.>"}, false)
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("missing stream with create=false: err %v", err)
	}

	info, err := natssink.EnsureStream(ctx, js, natssink.StreamConfig{Name: "NEW", Subject: "new.>", Storage: "memory", Replicas: 1, MaxAge: time.Hour, Duplicates: 3 * time.Minute, Discard: "new", MaxMsgs: 10}, true)
	if err != nil {
		t.Fatal(err)
	}
	c := info.Config
	if c.Storage != jetstream.MemoryStorage || c.MaxAge != time.Hour || c.Duplicates != 3*time.Minute || c.Discard != jetstream.DiscardNew || c.MaxMsgs != 10 {
		t.Errorf("created stream config %+v", c)
	}
}

// TestPublishToAStreamWithoutLeaderIsUnavailable: on a three-node cluster
// whose stream's one replica is on a server that is down, a publish gets
// no answer from any stream. The stream exists and captures the subject,
// so that is the cluster's state for now (unavailable, retried), not the
// broker's refusal, which TestPublishWithoutStreamIsRejected shows.
func TestPublishToAStreamWithoutLeaderIsUnavailable(t *testing.T) {
	ctx := context.Background()
	c, err := stack.StartNATSCluster(3, stack.NATSClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	admin, err := nats.Connect(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "STUDENTS", Subjects: []string{"student.>"}, Storage: jetstream.MemoryStorage, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	leader := s.CachedInfo().Cluster.Leader
	// The publisher is on another server, which stays up with the third.
	var other *stack.NATS
	for _, srv := range c.Servers {
		if srv.Server.Name() != leader {
			other = srv
			break
		}
	}
	nc, err := nats.Connect(other.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if _, err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	p, err := natssink.NewPublisher(nc, natssink.Config{Layout: layout(t), Stream: "STUDENTS", AckTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Publish(ctx, testEvent(t, "io.k8s.example.student.created", "x", nil))
	if !errors.Is(err, sink.ErrUnavailable) {
		t.Errorf("the stream's one replica down: err %v, want ErrUnavailable", err)
	}
}
