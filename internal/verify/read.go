package verify

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/consumer"
	"github.com/student-bridge/student-bridge/internal/natssink"
)

// Source says where the three sources are and what the bridge watches.
type Source struct {
	// NATS reads the stream and the record store.
	NATS *nats.Conn
	// Stream is the bridge's stream (nats.stream.name).
	Stream string
	// Bucket is the record store (records.bucket); empty: not compared.
	Bucket string
	// Kube lists the Students.
	Kube client.Reader
	// Namespaces the bridge watches (empty: all); Selector its label
	// selector (nil: everything).
	Namespaces []string
	Selector   labels.Selector
	// Cluster is the bridge's cluster name: events of other sources (other
	// clusters fanned into the same stream) are left out.
	Cluster string
	// Progress, when set, gets a line every ProgressEvery events read.
	Progress io.Writer
}

// ProgressEvery is how many events pass between two progress lines.
const ProgressEvery = 10000

// ReadError says which source could not be read.
type ReadError struct {
	// What is "stream", "record store" or "Students".
	What string
	Err  error
}

func (e *ReadError) Error() string { return fmt.Sprintf("read the %s: %v", e.What, e.Err) }
func (e *ReadError) Unwrap() error { return e.Err }

// Read reads the record store, the Students and the stream, in that
// order: a record is written after its event is in the stream, and the
// bridge publishes after the API server changed, so each source is read
// before the one that follows it in time.
func Read(ctx context.Context, src Source) (State, error) {
	var st State
	if src.Bucket != "" {
		recs, err := readRecords(ctx, src)
		if err != nil {
			return st, &ReadError{What: "record store", Err: err}
		}
		st.Records, st.RecordsRead = recs, true
	}
	students, err := readStudents(ctx, src)
	if err != nil {
		return st, &ReadError{What: "Students", Err: err}
	}
	st.Students = students
	if err := readStream(ctx, src, &st); err != nil {
		return st, &ReadError{What: "stream", Err: err}
	}
	return st, nil
}

func (src Source) inScope(namespace string) bool {
	return len(src.Namespaces) == 0 || slices.Contains(src.Namespaces, namespace)
}

func readRecords(ctx context.Context, src Source) ([]studentv1.StudentRecord, error) {
	kv, err := natssink.EnsureBucket(ctx, src.NATS, natssink.BucketConfig{Name: src.Bucket}, false)
	if err != nil {
		return nil, err
	}
	all, err := kv.Load(ctx)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", src.Bucket, err)
	}
	var out []studentv1.StudentRecord
	for _, r := range all {
		if rec, ok := contract.ParseRecord(r.Key, r.Value); ok && src.inScope(rec.Namespace) {
			out = append(out, rec)
		}
	}
	return out, nil
}

// readStudents lists the Students of the scope, 500 at a time.
func readStudents(ctx context.Context, src Source) ([]studentv1.Student, error) {
	namespaces := src.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{""}
	}
	var out []studentv1.Student
	for _, ns := range namespaces {
		cont := ""
		for {
			var list studentv1.StudentList
			opts := []client.ListOption{client.InNamespace(ns), client.Limit(500), client.Continue(cont)}
			if src.Selector != nil {
				opts = append(opts, client.MatchingLabelsSelector{Selector: src.Selector})
			}
			if err := src.Kube.List(ctx, &list, opts...); err != nil {
				return nil, err
			}
			out = append(out, list.Items...)
			if cont = list.Continue; cont == "" {
				break
			}
		}
	}
	return out, nil
}

// readStream reads every message of the stream up to its last sequence at
// the start, through an ordered consumer (in memory, no acknowledgements):
// it notices a message lost on the way, a consumer whose server stopped
// answering (a node of a cluster restarting) and a reconnect, and then
// reads on from the last message through a new consumer. Each consumer it
// made goes once it stops, or after a minute idle if the reading died.
func readStream(ctx context.Context, src Source, st *State) error {
	js, err := jetstream.New(src.NATS)
	if err != nil {
		return err
	}
	stream, err := js.Stream(ctx, src.Stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", src.Stream, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream %s: %w", src.Stream, err)
	}
	st.FirstSequence, st.LastSequence = info.State.FirstSeq, info.State.LastSeq
	if info.State.Msgs == 0 {
		return nil
	}
	cons, err := js.OrderedConsumer(ctx, src.Stream, jetstream.OrderedConsumerConfig{
		NamePrefix:        "verify-" + rand.Text(),
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: time.Minute,
		MaxResetAttempts:  readResets,
	})
	if err != nil {
		return fmt.Errorf("stream %s: %w", src.Stream, err)
	}
	it, err := cons.Messages(jetstream.PullHeartbeat(readHeartbeat))
	if err != nil {
		return fmt.Errorf("stream %s: %w", src.Stream, err)
	}
	defer it.Stop()
	source := contract.Source(src.Cluster)
	var read uint64
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return fmt.Errorf("stream %s: %w", src.Stream, err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return err
		}
		read++
		if e, err := decode(msg); err != nil {
			st.Unreadable = append(st.Unreadable, Message{StreamSequence: md.Sequence.Stream, Subject: msg.Subject(), Reason: err.Error()})
		} else if e.source == source && src.inScope(e.Data.Metadata.Namespace) {
			e.StreamSequence = md.Sequence.Stream
			st.Events = append(st.Events, e.Event)
		}
		if src.Progress != nil && read%ProgressEvery == 0 {
			fmt.Fprintf(src.Progress, "read %d of %d events of stream %s\n", read, info.State.Msgs, src.Stream)
		}
		if md.Sequence.Stream >= info.State.LastSeq || md.NumPending == 0 {
			return nil
		}
	}
}

// readHeartbeat is how often the server says a reading consumer is alive:
// after two missed, the reading goes on through a new consumer, which the
// server may place on another node. readResets is how many new consumers
// a reading makes in a row (one second apart, doubling up to ten) before
// it gives up.
const (
	readHeartbeat = 2 * time.Second
	readResets    = 10
)

type decoded struct {
	Event
	source string
}

var errNotStudent = errors.New("not a Student CloudEvent")

func decode(msg jetstream.Msg) (decoded, error) {
	ce, err := consumer.DecodeMsg(context.Background(), &nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()})
	if err != nil {
		return decoded{}, err
	}
	switch ce.Type() {
	case studentv1.EventTypeCreated, studentv1.EventTypeUpdated, studentv1.EventTypeDeleted, studentv1.EventTypeSnapshot:
	default:
		return decoded{}, errNotStudent
	}
	d := decoded{source: ce.Source(), Event: Event{ID: ce.ID(), Type: ce.Type()}}
	if err := ce.DataAs(&d.Data); err != nil || d.Data.Metadata.UID == "" {
		return decoded{}, errNotStudent
	}
	d.Sequence, _ = studentv1.ParseSequence(ce.Extensions()[studentv1.ExtensionSequence])
	d.PreviousID, _ = ce.Extensions()[studentv1.ExtensionPreviousID].(string)
	return d, nil
}

// Verify reads the three sources and checks them. With o.Settle, drift is
// read and checked again after that long, and only the findings that are
// there both times are reported: a change in flight the first time is
// published by the second.
func Verify(ctx context.Context, src Source, o Options) (Report, error) {
	st, err := Read(ctx, src)
	if err != nil {
		return Report{}, err
	}
	first := Check(st, o)
	if o.Settle <= 0 || len(first.Drift()) == 0 {
		return first, nil
	}
	if src.Progress != nil {
		fmt.Fprintf(src.Progress, "%d finding(s); checking again in %s (changes in flight settle)\n", len(first.Drift()), o.Settle)
	}
	select {
	case <-ctx.Done():
		return Report{}, ctx.Err()
	case <-time.After(o.Settle):
	}
	if st, err = Read(ctx, src); err != nil {
		return Report{}, err
	}
	second := Check(st, o)
	before := map[string]bool{}
	for _, f := range first.Findings {
		before[f.Key()] = true
	}
	kept := second.Findings[:0]
	for _, f := range second.Findings {
		if f.Kind == Unknown || before[f.Key()] {
			kept = append(kept, f)
		}
	}
	second.Findings = kept
	return second, nil
}

// Print writes r for a person: what was read, one line per finding, and a
// summary.
func Print(w io.Writer, r Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	records := "record store not read"
	if r.RecordsRead {
		records = plural(r.Records, "record")
	}
	fmt.Fprintf(tw, "read %s (stream sequences %d to %d), %s, %s\n", plural(r.Events, "event"), r.FirstSequence, r.LastSequence, plural(r.Students, "Student"), records)
	if len(r.Findings) > 0 {
		fmt.Fprintln(tw, "KIND\tSTUDENT\tUID\tDETAIL")
		for _, f := range r.Findings {
			student, uid := f.Namespace+"/"+f.Name, f.UID
			if f.Name == "" {
				student, uid = "-", "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Kind, student, uid, f.Detail)
		}
	}
	counts := map[Kind]int{}
	var kinds []Kind
	for _, f := range r.Findings {
		if counts[f.Kind] == 0 {
			kinds = append(kinds, f.Kind)
		}
		counts[f.Kind]++
	}
	slices.Sort(kinds)
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%d %s", counts[k], k))
	}
	switch drift := len(r.Drift()); {
	case drift == 0 && len(r.Findings) == 0:
		fmt.Fprintln(tw, "no findings: the stream, the record store and the Students agree")
	case drift == 0:
		fmt.Fprintf(tw, "no drift (%s: their events may have left the stream; --strict counts them as missing)\n", strings.Join(parts, ", "))
	case len(r.Findings) == 1:
		fmt.Fprintf(tw, "1 finding: %s\n", strings.Join(parts, ", "))
	default:
		fmt.Fprintf(tw, "%d findings: %s\n", len(r.Findings), strings.Join(parts, ", "))
	}
	return tw.Flush()
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
