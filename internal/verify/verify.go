// Package verify checks that the bridge's stream tells the truth about the
// Students: it compares the events in the JetStream stream with the
// Students the API server holds and with the bridge's record store. It is
// what `student-bridge verify` reports and what the fault tests assert, so
// what the tests prove is what an operator can check again.
package verify

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// Kind names a finding.
type Kind string

// The kinds of finding. Every kind but Unknown is drift: the stream, the
// record store and the API server disagree.
const (
	// Missing: a Student with no event, or whose last event does not carry
	// its current spec, labels and generation (or says it was deleted).
	Missing Kind = "missing"
	// LostDelete: no Student (in the watched scope) has the uid, and its
	// last event is not deleted: consumers still hold it.
	LostDelete Kind = "lost delete"
	// StaleRecord: the record store disagrees with the stream: a record
	// names an event the stream does not end with, or a Student the
	// stream shows published has no record.
	StaleRecord Kind = "stale record"
	// Duplicate: one CloudEvent id more than once in the stream (the
	// stream's duplicate window had passed).
	Duplicate Kind = "duplicate"
	// Gap: a Student's events skip or repeat a number of its sequence (or
	// name a previous event that is not the one before them): an event is
	// not in the stream, or was numbered twice.
	Gap Kind = "gap"
	// OutOfOrder: an event of an older generation after a newer one, or a
	// change after the Student's deleted event.
	OutOfOrder Kind = "out of order"
	// Foreign: a message on the bridge's stream that the bridge did not
	// publish: not a Student CloudEvent, or one whose id does not follow
	// from its data and the event before it (as the bridge derives every
	// change's id). Consumers may take it for an event; whoever may
	// publish on the bridge's subjects should not.
	Foreign Kind = "foreign"
	// Unknown: a Student with no event while older events have left the
	// stream (its limits, a purge): its events may have been among them.
	// Not drift, unless Options.Strict.
	Unknown Kind = "unknown"
)

// Event is one Student CloudEvent of the stream.
type Event struct {
	// StreamSequence is its place in the stream.
	StreamSequence uint64
	ID             string
	Type           string
	// Sequence is the Student's own count (the sequence extension); 0
	// when the event has none (published before the bridge counted).
	Sequence int64
	// PreviousID is the previousid extension.
	PreviousID string
	Data       studentv1.StudentEventData
}

// State is what Check compares: the three sources, read close together.
type State struct {
	// Events are the Student events of the watched scope in stream order.
	Events []Event
	// FirstSequence and LastSequence bound what the stream holds; a first
	// sequence above 1 means older events have left it.
	FirstSequence, LastSequence uint64
	// Students are the Students of the watched scope.
	Students []studentv1.Student
	// Records are the record store's records of the watched namespaces;
	// RecordsRead is false when the store was not read (no comparison).
	Records     []studentv1.StudentRecord
	RecordsRead bool
	// Unreadable are the messages that are not Student CloudEvents.
	Unreadable []Message
}

// Message is a message of the stream that is not a Student CloudEvent.
type Message struct {
	StreamSequence uint64
	Subject        string
	// Reason says why it could not be read as one.
	Reason string
}

// Options tune Check.
type Options struct {
	// Strict reports a Student with no event as missing even when older
	// events have left the stream.
	Strict bool
	// Settle, for Verify, is how long to wait before checking drift again.
	Settle time.Duration
}

// Finding is one disagreement, about one Student (or one event id).
type Finding struct {
	Kind      Kind   `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	Detail    string `json:"detail"`
	// StreamSequence is the message's place in the stream, for foreign
	// messages.
	StreamSequence uint64 `json:"streamSequence,omitempty"`
}

// Key identifies a finding across two readings (the settle re-check): its
// kind and Student (and message, if foreign), not its wording, which may
// name newer events.
func (f Finding) Key() string {
	return fmt.Sprintf("%s\x00%s\x00%d", f.Kind, f.UID, f.StreamSequence)
}

// Report is the outcome of Check.
type Report struct {
	Events        int       `json:"events"`
	FirstSequence uint64    `json:"firstSequence"`
	LastSequence  uint64    `json:"lastSequence"`
	Students      int       `json:"students"`
	Records       int       `json:"records"`
	RecordsRead   bool      `json:"recordsRead"`
	Unreadable    int       `json:"unreadable"`
	Findings      []Finding `json:"findings"`
}

// Drift returns the findings that are drift (all but Unknown).
func (r Report) Drift() []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if f.Kind != Unknown {
			out = append(out, f)
		}
	}
	return out
}

// Count returns how many findings are of kind k.
func (r Report) Count(k Kind) int {
	n := 0
	for _, f := range r.Findings {
		if f.Kind == k {
			n++
		}
	}
	return n
}

// Err is nil when there is no drift, else an error naming the first few
// findings (for tests and logs).
func (r Report) Err() error {
	drift := r.Drift()
	if len(drift) == 0 {
		return nil
	}
	msg := fmt.Sprintf("%d finding(s):", len(drift))
	for i, f := range drift {
		if i == 5 {
			msg += fmt.Sprintf(" ... and %d more", len(drift)-i)
			break
		}
		msg += fmt.Sprintf(" [%s %s/%s: %s]", f.Kind, f.Namespace, f.Name, f.Detail)
	}
	return fmt.Errorf("%s", msg)
}

// student is what the stream says of one uid.
type student struct {
	events  []Event // in stream order
	changes []Event // the events that are changes (not snapshots)
}

func (s *student) last() Event { return s.events[len(s.events)-1] }

func (s *student) lastChange() (Event, bool) {
	if len(s.changes) == 0 {
		return Event{}, false
	}
	return s.changes[len(s.changes)-1], true
}

// Check compares the stream, the record store and the Students of st.
func Check(st State, o Options) Report {
	r := Report{Events: len(st.Events), FirstSequence: st.FirstSequence, LastSequence: st.LastSequence,
		Students: len(st.Students), Records: len(st.Records), RecordsRead: st.RecordsRead, Unreadable: len(st.Unreadable)}
	agedOut := st.FirstSequence > 1
	add := func(k Kind, ns, name, uid, format string, args ...any) {
		if k == Unknown && o.Strict {
			k = Missing
		}
		r.Findings = append(r.Findings, Finding{Kind: k, Namespace: ns, Name: name, UID: uid, Detail: fmt.Sprintf(format, args...)})
	}

	for _, m := range st.Unreadable {
		r.Findings = append(r.Findings, Finding{Kind: Foreign, StreamSequence: m.StreamSequence,
			Detail: fmt.Sprintf("stream sequence %d on %s is not a Student CloudEvent: %s", m.StreamSequence, m.Subject, m.Reason)})
	}

	byUID := map[string]*student{}
	ids := map[string][]Event{}
	for _, e := range st.Events {
		if !derived(e) {
			md := e.Data.Metadata
			r.Findings = append(r.Findings, Finding{Kind: Foreign, Namespace: md.Namespace, Name: md.Name, UID: md.UID, StreamSequence: e.StreamSequence,
				Detail: fmt.Sprintf("event %s (%s, stream sequence %d) is not one the bridge published: its id does not follow from its data and the event before it",
					e.ID, studentv1.Operation(e.Type), e.StreamSequence)})
			continue
		}
		s := byUID[e.Data.Metadata.UID]
		if s == nil {
			s = &student{}
			byUID[e.Data.Metadata.UID] = s
		}
		s.events = append(s.events, e)
		// A copy of an earlier event is reported as a duplicate, not as a
		// break in the Student's order.
		if e.Type != studentv1.EventTypeSnapshot && len(ids[e.ID]) == 0 {
			s.changes = append(s.changes, e)
		}
		ids[e.ID] = append(ids[e.ID], e)
	}

	for _, id := range slices.Sorted(maps.Keys(ids)) {
		if evs := ids[id]; len(evs) > 1 {
			md := evs[0].Data.Metadata
			seqs := make([]uint64, len(evs))
			for i, e := range evs {
				seqs[i] = e.StreamSequence
			}
			add(Duplicate, md.Namespace, md.Name, md.UID, "event %s (%s) is in the stream %d times, at stream sequences %v", id, studentv1.Operation(evs[0].Type), len(evs), seqs)
		}
	}

	for _, uid := range slices.Sorted(maps.Keys(byUID)) {
		checkOrder(byUID[uid], add)
	}

	records := map[string]studentv1.StudentRecord{}
	for _, rec := range st.Records {
		records[string(rec.UID)] = rec
	}
	live := map[string]bool{}
	for i := range st.Students {
		stu := &st.Students[i]
		uid := string(stu.UID)
		live[uid] = true
		s := byUID[uid]
		if s == nil {
			if agedOut {
				add(Unknown, stu.Namespace, stu.Name, uid, "no event in the stream, whose events before stream sequence %d have left it", st.FirstSequence)
			} else {
				add(Missing, stu.Namespace, stu.Name, uid, "no event in the stream")
			}
			continue
		}
		last := s.last()
		switch {
		case last.Type == studentv1.EventTypeDeleted && !stu.DeletionTimestamp.IsZero():
			// Published as deleted; its finalizer is on its way out.
		case last.Type == studentv1.EventTypeDeleted:
			add(Missing, stu.Namespace, stu.Name, uid, "its last event %s (stream sequence %d) is deleted, but the Student exists", last.ID, last.StreamSequence)
		case !sameState(last.Data, stu):
			add(Missing, stu.Namespace, stu.Name, uid, "its last event %s (%s, stream sequence %d) carries %s; the Student is %s",
				last.ID, studentv1.Operation(last.Type), last.StreamSequence, describe(last.Data.Metadata.Generation, last.Data.Spec, last.Data.Metadata.Labels),
				describe(stu.Generation, stu.Spec, stu.Labels))
		}
	}
	for _, uid := range slices.Sorted(maps.Keys(byUID)) {
		if live[uid] {
			continue
		}
		last := byUID[uid].last()
		md := last.Data.Metadata
		if last.Type == studentv1.EventTypeDeleted {
			continue
		}
		if rec, ok := records[uid]; ok && rec.Pending {
			continue // its first event's record is pending: the bridge's catch-up publishes the delete
		}
		add(LostDelete, md.Namespace, md.Name, uid, "no Student in the watched scope has this uid, and its last event %s (stream sequence %d) is %s, not deleted",
			last.ID, last.StreamSequence, studentv1.Operation(last.Type))
	}
	if st.RecordsRead {
		checkRecords(records, byUID, live, agedOut, add)
	}
	slices.SortStableFunc(r.Findings, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID), cmp.Compare(a.Kind, b.Kind))
	})
	return r
}

// derived reports whether e's id is the one the bridge derives for a
// change with e's data (contract.EventID), chained to the event before
// it or, for a first event whose record was pending, to none. Snapshots'
// ids name their run, which the event does not carry: they are taken as
// they are.
func derived(e Event) bool {
	if e.Type == studentv1.EventTypeSnapshot {
		return true
	}
	md := e.Data.Metadata
	s := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{UID: types.UID(md.UID), Generation: md.Generation, Labels: md.Labels}, Spec: e.Data.Spec}
	return e.ID == contract.EventID(e.Type, s, e.PreviousID) || e.ID == contract.EventID(e.Type, s, "")
}

type addFunc func(k Kind, ns, name, uid, format string, args ...any)

// checkOrder checks one Student's changes follow each other: numbered one
// after another, each naming the one before, no older generation after a
// newer one, nothing after the deleted but a created (it came back into
// the watched scope).
func checkOrder(s *student, add addFunc) {
	// The first event is not checked: a Student's first publish may not have
	// reached the stream (the bridge stopped before its ack, its record
	// pending), and the bridge counts on from it all the same.
	for i, e := range s.changes {
		if i == 0 {
			continue
		}
		md := e.Data.Metadata
		prev := s.changes[i-1]
		switch {
		case prev.Sequence > 0 && e.Sequence > 0 && e.Sequence != prev.Sequence+1:
			add(Gap, md.Namespace, md.Name, md.UID, "event %s (stream sequence %d) is number %d of the Student's, after number %d",
				e.ID, e.StreamSequence, e.Sequence, prev.Sequence)
		case e.PreviousID != "" && e.PreviousID != prev.ID:
			add(Gap, md.Namespace, md.Name, md.UID, "event %s (stream sequence %d) follows %s, but names %s as the one before it",
				e.ID, e.StreamSequence, prev.ID, e.PreviousID)
		}
		switch {
		case prev.Type == studentv1.EventTypeDeleted && e.Type != studentv1.EventTypeCreated:
			add(OutOfOrder, md.Namespace, md.Name, md.UID, "event %s (%s, stream sequence %d) follows its deleted event %s",
				e.ID, studentv1.Operation(e.Type), e.StreamSequence, prev.ID)
		case md.Generation < prev.Data.Metadata.Generation:
			add(OutOfOrder, md.Namespace, md.Name, md.UID, "event %s (stream sequence %d) is of generation %d, after %s of generation %d",
				e.ID, e.StreamSequence, md.Generation, prev.ID, prev.Data.Metadata.Generation)
		}
	}
}

// checkRecords compares the record store with the stream: a record names
// the Student's last change in the stream, and a Student that exists and
// whose last change is not deleted has a record.
func checkRecords(records map[string]studentv1.StudentRecord, byUID map[string]*student, live map[string]bool, agedOut bool, add addFunc) {
	for _, uid := range slices.Sorted(maps.Keys(records)) {
		rec := records[uid]
		var last Event
		var ok bool
		if s := byUID[uid]; s != nil {
			last, ok = s.lastChange()
		}
		p := rec.Published
		switch {
		case rec.Pending || rec.Reserved():
			// Its reserved event is on its way, or out and not yet
			// recorded: the stream ends with it, or with the event it
			// follows.
			after := reservedAfter(rec)
			switch {
			case ok && (last.ID == p.ID || last.ID == after), !ok && (after == "" || agedOut):
			case ok:
				add(StaleRecord, rec.Namespace, rec.Name, uid, "the record reserves %s %s (sequence %d) after %s, but the stream's last event of it is %s %s (sequence %d)",
					studentv1.Operation(p.Type), p.ID, p.StudentSequence, cmp.Or(after, "nothing"), studentv1.Operation(last.Type), last.ID, last.Sequence)
			default:
				add(StaleRecord, rec.Namespace, rec.Name, uid, "the record reserves %s %s (sequence %d) after %s; the stream has no event of this Student",
					studentv1.Operation(p.Type), p.ID, p.StudentSequence, after)
			}
		case !ok && agedOut:
			// Its events may have left the stream.
		case !ok:
			add(StaleRecord, rec.Namespace, rec.Name, uid, "the record says %s %s (sequence %d) was published; the stream has no event of this Student",
				studentv1.Operation(p.Type), p.ID, p.StudentSequence)
		case last.ID != p.ID:
			add(StaleRecord, rec.Namespace, rec.Name, uid, "the record says %s %s (sequence %d) was published last; the stream's last event is %s %s (sequence %d)",
				studentv1.Operation(p.Type), p.ID, p.StudentSequence, studentv1.Operation(last.Type), last.ID, last.Sequence)
		}
	}
	for _, uid := range slices.Sorted(maps.Keys(byUID)) {
		last, ok := byUID[uid].lastChange()
		if _, recorded := records[uid]; recorded || !ok || !live[uid] || last.Type == studentv1.EventTypeDeleted {
			continue
		}
		md := last.Data.Metadata
		add(StaleRecord, md.Namespace, md.Name, uid, "the stream's last event of it is %s %s (stream sequence %d); the record store has no record of it",
			studentv1.Operation(last.Type), last.ID, last.StreamSequence)
	}
}

// reservedAfter is the id of the event a pending record's reserved event
// names as the one before it ("" for a first event, and for a record
// written before v0.3.0, which carries no event).
func reservedAfter(rec studentv1.StudentRecord) string {
	var ev map[string]any
	if json.Unmarshal(rec.Event, &ev) != nil {
		return ""
	}
	after, _ := ev[studentv1.ExtensionPreviousID].(string)
	return after
}

func sameState(d studentv1.StudentEventData, s *studentv1.Student) bool {
	return d.Spec == s.Spec && d.Metadata.Generation == s.Generation && maps.Equal(d.Metadata.Labels, s.Labels)
}

func describe(gen int64, spec studentv1.StudentSpec, labels map[string]string) string {
	out := fmt.Sprintf("generation %d, name %q, school %q", gen, spec.Name, spec.School)
	if len(labels) > 0 {
		out += ", labels"
		for _, k := range slices.Sorted(maps.Keys(labels)) {
			out += " " + k + "=" + labels[k]
		}
	}
	return out
}
