package tail_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/internal/tail"
)

type fixture struct {
	nc  *nats.Conn
	url string
	pub *natssink.Publisher
	gen map[string]int64
}

func setup(t *testing.T) *fixture {
	t.Helper()
	n, err := stack.StartNATS(stack.NATSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if _, err := natssink.EnsureStream(context.Background(), js, natssink.StreamConfig{Name: "STUDENTS", Subject: "student.>", Storage: "memory", Replicas: 1, Duplicates: time.Minute}, true); err != nil {
		t.Fatal(err)
	}
	l, _ := natssink.NewSubjectLayout("student", natssink.DefaultSubjectLayout)
	pub, err := natssink.NewPublisher(nc, natssink.Config{Layout: l})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{nc: nc, url: n.URL(), pub: pub, gen: map[string]int64{}}
}

// publish sends the event a bridge would send for a change of name.
func (f *fixture) publish(t *testing.T, typ, name, school string) {
	t.Helper()
	f.gen[name]++
	s := &studentv1.Student{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name), Generation: f.gen[name]},
		Spec:       studentv1.StudentSpec{Name: name, School: school},
	}
	prev := &studentv1.PublishedEvent{Spec: studentv1.StudentSpec{Name: name, School: "old"}}
	ev, err := contract.NewEvent("test", typ, contract.EventID(typ, s, ""), s, prev, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.pub.Publish(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
}

// history publishes five events and returns the time between the second and
// the third.
func (f *fixture) history(t *testing.T) time.Time {
	f.publish(t, studentv1.EventTypeCreated, "a", "s1")
	f.publish(t, studentv1.EventTypeCreated, "b", "s1")
	// The server stamps each event: mid must fall between two stamps.
	time.Sleep(50 * time.Millisecond) // the server's clock moves past the second event
	mid := time.Now()
	time.Sleep(50 * time.Millisecond) // and past mid before the third
	f.publish(t, studentv1.EventTypeUpdated, "a", "s2")
	f.publish(t, studentv1.EventTypeCreated, "c", "s1")
	f.publish(t, studentv1.EventTypeDeleted, "b", "s1")
	return mid
}

func run(t *testing.T, nc *nats.Conn, o tail.Options) []string {
	t.Helper()
	var out bytes.Buffer
	o.Out = &out
	if o.Stream == "" {
		o.Stream = "STUDENTS"
	}
	if o.Subjects == nil {
		o.Subjects = []string{"student.>"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := tail.Run(ctx, nc, o); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatal("tail did not return once the stream was read")
	}
	s := strings.TrimSpace(out.String())
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// summary reduces text lines to "#seq op name".
func summary(lines []string) string {
	var out []string
	for _, l := range lines {
		f := strings.Fields(l)
		out = append(out, f[1]+" "+f[2]+" "+strings.TrimPrefix(f[3], "default/"))
	}
	return strings.Join(out, ", ")
}

func TestReplayModes(t *testing.T) {
	f := setup(t)
	mid := f.history(t)
	cases := []struct {
		name string
		o    tail.Options
		want string
	}{
		{"all", tail.Options{Deliver: tail.DeliverAll}, "#1 created a, #2 created b, #3 updated a, #4 created c, #5 deleted b"},
		{"last per student", tail.Options{Deliver: tail.DeliverLast}, "#3 updated a, #4 created c, #5 deleted b"},
		{"from sequence", tail.Options{Deliver: tail.DeliverSequence, FromSequence: 4}, "#4 created c, #5 deleted b"},
		{"since", tail.Options{Deliver: tail.DeliverSince, Since: mid}, "#3 updated a, #4 created c, #5 deleted b"},
		{"new only", tail.Options{Deliver: tail.DeliverNew}, ""},
		{"filtered subject", tail.Options{Deliver: tail.DeliverAll, Subjects: []string{"student.created"}}, "#1 created a, #2 created b, #4 created c"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := summary(run(t, f.nc, tc.o)); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestTextShowsWhatChanged(t *testing.T) {
	f := setup(t)
	f.history(t)
	lines := run(t, f.nc, tail.Options{Deliver: tail.DeliverSequence, FromSequence: 3})
	if !strings.Contains(lines[0], `school: "old" -> "s2"`) || !strings.Contains(lines[0], "gen=2") {
		t.Errorf("update line %q does not show the change", lines[0])
	}
	if !strings.Contains(lines[1], `name="c" school="s1"`) {
		t.Errorf("create line %q does not show the spec", lines[1])
	}
}

func TestJSONLinesAreCloudEvents(t *testing.T) {
	f := setup(t)
	f.history(t)
	lines := run(t, f.nc, tail.Options{Deliver: tail.DeliverAll, JSON: true})
	if len(lines) != 5 {
		t.Fatalf("%d lines", len(lines))
	}
	for _, l := range lines {
		var ev cloudevents.Event
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		if err := ev.Validate(); err != nil || !strings.HasPrefix(ev.Type(), "io.k8s.example.student.") {
			t.Errorf("%q: %v", l, err)
		}
	}
}

func TestDurableResumesWithoutRepeats(t *testing.T) {
	f := setup(t)
	f.history(t)
	o := tail.Options{Deliver: tail.DeliverAll, Durable: "billing"}
	if got := summary(run(t, f.nc, o)); got != "#1 created a, #2 created b, #3 updated a, #4 created c, #5 deleted b" {
		t.Fatalf("first run: %s", got)
	}
	f.publish(t, studentv1.EventTypeUpdated, "c", "s3")
	if got := summary(run(t, f.nc, o)); got != "#6 updated c" {
		t.Errorf("resumed run: %q, want only #6", got)
	}
	if got := summary(run(t, f.nc, o)); got != "" {
		t.Errorf("third run repeated %q", got)
	}
}

// TestReplayThenFollow: in follow mode every delivery mode prints its
// history and then goes on with new events; a durable follow resumes with
// only what was published while it was away.
func TestReplayThenFollow(t *testing.T) {
	history := "#1 created a, #2 created b, #3 updated a, #4 created c, #5 deleted b"
	cases := []struct {
		name    string
		o       tail.Options
		printed string // the history printed before the new event
	}{
		{"all", tail.Options{Deliver: tail.DeliverAll}, history},
		{"last per student", tail.Options{Deliver: tail.DeliverLast}, "#3 updated a, #4 created c, #5 deleted b"},
		{"from sequence", tail.Options{Deliver: tail.DeliverSequence, FromSequence: 4}, "#4 created c, #5 deleted b"},
		{"since", tail.Options{Deliver: tail.DeliverSince}, "#3 updated a, #4 created c, #5 deleted b"},
		{"new (the default)", tail.Options{Deliver: tail.DeliverNew}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t)
			mid := f.history(t)
			if tc.o.Deliver == tail.DeliverSince {
				tc.o.Since = mid
			}
			got := f.follow(t, tc.o, strings.Count(tc.printed, "#"), "d")
			want := strings.TrimPrefix(tc.printed+", #6 created d", ", ")
			if got != want {
				t.Errorf("got  %s\nwant %s", got, want)
			}
		})
	}
	t.Run("durable", func(t *testing.T) {
		f := setup(t)
		f.history(t)
		o := tail.Options{Deliver: tail.DeliverAll, Durable: "billing"}
		if got := f.follow(t, o, 5, "d"); got != history+", #6 created d" {
			t.Fatalf("first run: %s", got)
		}
		f.publish(t, studentv1.EventTypeCreated, "e", "s1")
		if got := f.follow(t, o, 1, "f"); got != "#7 created e, #8 created f" {
			t.Errorf("resumed follow: %s, want only what came while it was away and then the new event", got)
		}
	})
}

// TestDurableFollowHandsBackWhatItDidNotPrint: a following durable tail
// reads ahead; stopped after ten lines, it hands the events it had read but
// not printed back, so the next run goes on with the eleventh at once, in
// order (not after the consumer's ack wait of 30 s).
func TestDurableFollowHandsBackWhatItDidNotPrint(t *testing.T) {
	f := setup(t)
	const total = 200
	for i := range total {
		f.publish(t, studentv1.EventTypeCreated, fmt.Sprintf("s%03d", i), "s1")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out bytes.Buffer
	o := tail.Options{Stream: "STUDENTS", Subjects: []string{"student.>"}, Deliver: tail.DeliverAll, Durable: "billing", Follow: true}
	o.Out = stopAfter{w: &out, lines: 10, stop: cancel}
	if err := tail.Run(ctx, f.nc, o); err != nil {
		t.Fatal(err)
	}
	// The stop may let one more line through (a message already at hand).
	printed := strings.Count(out.String(), "\n")
	if printed < 10 || printed > 20 {
		t.Fatalf("the following tail printed %d lines before it stopped, want 10 or a few more", printed)
	}
	rest := run(t, f.nc, tail.Options{Deliver: tail.DeliverAll, Durable: "billing"})
	if len(rest) != total-printed {
		t.Fatalf("the next run printed %d events, want the %d the first did not print", len(rest), total-printed)
	}
	for i, l := range rest {
		if want := fmt.Sprintf("#%d created s%03d", printed+1+i, printed+i); summary([]string{l}) != want {
			t.Fatalf("line %d of the next run: %q, want %s", i, summary([]string{l}), want)
		}
	}
}

// stopAfter writes until it has written lines lines, then calls stop.
type stopAfter struct {
	w     *bytes.Buffer
	lines int
	stop  func()
}

func (s stopAfter) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	if strings.Count(s.w.String(), "\n") >= s.lines {
		s.stop()
	}
	return n, err
}

// follow runs tail in follow mode until it printed printed lines, publishes
// a created event of name, waits for it and returns the summary of all it
// printed.
func (f *fixture) follow(t *testing.T, o tail.Options, printed int, name string) string {
	t.Helper()
	o.Stream, o.Subjects, o.Follow = "STUDENTS", []string{"student.>"}, true
	var out stacktest.Buffer
	o.Out = &out
	lines := func() []string {
		if s := strings.TrimSpace(out.String()); s != "" {
			return strings.Split(s, "\n")
		}
		return nil
	}
	// Each follow is a tail process of its own, with its own connection.
	nc, err := nats.Connect(f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tail.Run(ctx, nc, o) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}()
	// Publish only once tail's consumer exists and the history is out, or
	// deliver=new rightly misses the event.
	js, _ := jetstream.New(f.nc)
	if err := stacktest.Eventually(10*time.Second, func() error {
		info, err := js.Stream(ctx, "STUDENTS")
		if err != nil {
			return err
		}
		if info.CachedInfo().State.Consumers == 0 || len(lines()) < printed {
			return errNotYet
		}
		return nil
	}); err != nil {
		t.Fatalf("history not printed: %q", lines())
	}
	f.publish(t, studentv1.EventTypeCreated, name, "s1")
	if err := stacktest.Eventually(10*time.Second, func() error {
		if !strings.Contains(strings.Join(lines(), "\n"), "created  default/"+name) {
			return errNotYet
		}
		return nil
	}); err != nil {
		t.Fatalf("new event not printed; output %q", lines())
	}
	return summary(lines())
}

var errNotYet = &notYet{}

type notYet struct{}

func (*notYet) Error() string { return "not yet" }
