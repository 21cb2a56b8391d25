package verify_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/verify"
)

// These cases check the comparison itself, on states built by hand; what
// the bridge publishes is checked against a real stream in
// internal/bridge (TestVerifyFindsEachKindOfDrift) and test/e2e.

func student(uid, school string, gen int64) studentv1.Student {
	return studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: uid, UID: types.UID(uid), Generation: gen},
		Spec: studentv1.StudentSpec{Name: uid, School: school}}
}

// ids maps the names the cases give events to the ids the bridge derives
// for them (contract.EventID); a name never given (a made-up id) stands
// for itself.
var ids = map[string]string{}

func id(name string) string {
	if v, ok := ids[name]; ok {
		return v
	}
	return name
}

// event is a change (or snapshot) of s as the bridge publishes it: its id
// derived from s and the event named previous; name names it for later
// events and records.
func event(seq uint64, typ, name string, s studentv1.Student, number int64, previous string) verify.Event {
	previous = id(previous)
	evID := name
	if typ != snapshot {
		evID = contract.EventID(typ, &s, previous)
		ids[name] = evID
	}
	return foreign(seq, typ, evID, s, number, previous)
}

// foreign is an event with the id given, whatever its data.
func foreign(seq uint64, typ, id string, s studentv1.Student, number int64, previous string) verify.Event {
	return verify.Event{StreamSequence: seq, ID: id, Type: typ, Sequence: number, PreviousID: previous,
		Data: studentv1.StudentEventData{Metadata: studentv1.EventObjectMeta{Namespace: s.Namespace, Name: s.Name, UID: string(s.UID), Generation: s.Generation, Labels: s.Labels}, Spec: s.Spec}}
}

func record(s studentv1.Student, typ, name string, number int64, pending bool) studentv1.StudentRecord {
	return studentv1.StudentRecord{Namespace: s.Namespace, Name: s.Name, UID: s.UID, Pending: pending,
		Published: studentv1.PublishedEvent{Type: typ, ID: id(name), StudentSequence: number, Generation: s.Generation, Spec: s.Spec}}
}

// reserved is rec reserving its event, which names the event named after
// as the one before it.
func reserved(rec studentv1.StudentRecord, after string) studentv1.StudentRecord {
	rec.Event = []byte(fmt.Sprintf(`{"specversion":"1.0","id":%q,"previousid":%q}`, rec.Published.ID, id(after)))
	return rec
}

const (
	created  = studentv1.EventTypeCreated
	updated  = studentv1.EventTypeUpdated
	deleted  = studentv1.EventTypeDeleted
	snapshot = studentv1.EventTypeSnapshot
)

func TestCheck(t *testing.T) {
	a1, a2 := student("a", "china", 1), student("a", "tsinghua", 2)
	b1 := student("b", "china", 1)
	for _, tc := range []struct {
		name string
		st   verify.State
		o    verify.Options
		want []string // "kind name"
	}{{
		name: "agree: changes, a snapshot of the last, a record of each",
		st: verify.State{FirstSequence: 1, Students: []studentv1.Student{a2, b1}, RecordsRead: true,
			Events: []verify.Event{event(1, created, "a1", a1, 1, ""), event(2, created, "b1", b1, 1, ""), event(3, updated, "a2", a2, 2, "a1"),
				event(4, snapshot, "sa", a2, 2, "a2")},
			Records: []studentv1.StudentRecord{record(a2, updated, "a2", 2, false), record(b1, created, "b1", 1, false)}},
	}, {
		name: "a change not published yet, and its record",
		st: verify.State{FirstSequence: 1, Students: []studentv1.Student{a2}, RecordsRead: true,
			Events: []verify.Event{event(1, created, "a1", a1, 1, "")}, Records: []studentv1.StudentRecord{record(a2, updated, "a2", 2, false)}},
		want: []string{"missing a", "stale record a"},
	}, {
		name: "a label changed and not published: same spec and generation, other labels",
		st: verify.State{FirstSequence: 1, Students: []studentv1.Student{labelled(a1, "grade", "2")},
			Events: []verify.Event{event(1, created, "a1", labelled(a1, "grade", "1"), 1, "")}},
		want: []string{"missing a"},
	}, {
		name: "gone, and its first event's record pending: the catch-up publishes the delete",
		st: verify.State{FirstSequence: 1, RecordsRead: true,
			Events: []verify.Event{event(1, created, "a1", a1, 1, "")}, Records: []studentv1.StudentRecord{record(a1, created, "a1", 1, true)}},
	}, {
		name: "an update reserved, not out yet: the stream ends with the event it follows (its state is missing, for now)",
		st: verify.State{FirstSequence: 1, Students: []studentv1.Student{a2}, RecordsRead: true,
			Events: []verify.Event{event(1, created, "a1", a1, 1, "")}, Records: []studentv1.StudentRecord{reserved(record(a2, updated, "a2", 2, false), "a1")}},
		want: []string{"missing a"},
	}, {
		name: "an update reserved and out, its record not yet written",
		st: verify.State{FirstSequence: 1, Students: []studentv1.Student{a2}, RecordsRead: true,
			Events: []verify.Event{event(1, created, "a1", a1, 1, ""), event(2, updated, "a2", a2, 2, "a1")}, Records: []studentv1.StudentRecord{reserved(record(a2, updated, "a2", 2, false), "a1")}},
	}, {
		name: "a reservation after an event the stream does not end with",
		st: verify.State{FirstSequence: 1, Students: []studentv1.Student{a1}, RecordsRead: true,
			Events: []verify.Event{event(1, created, "a1", a1, 1, "")}, Records: []studentv1.StudentRecord{reserved(record(a2, updated, "a3", 3, false), "a2")}},
		want: []string{"stale record a"},
	}, {
		name: "gone without a deleted event, no record",
		st:   verify.State{FirstSequence: 1, RecordsRead: true, Events: []verify.Event{event(1, created, "a1", a1, 1, "")}},
		want: []string{"lost delete a"},
	}, {
		name: "deleted, still held by another finalizer",
		st: verify.State{FirstSequence: 1, Students: []studentv1.Student{held(a1)},
			Events: []verify.Event{event(1, created, "a1", a1, 1, ""), event(2, deleted, "ad", a1, 2, "a1")}},
	}, {
		name: "events aged out: unknown, missing when strict",
		st:   verify.State{FirstSequence: 40, Students: []studentv1.Student{b1}},
		want: []string{"unknown b"},
	}, {
		name: "events aged out, strict",
		st:   verify.State{FirstSequence: 40, Students: []studentv1.Student{b1}},
		o:    verify.Options{Strict: true},
		want: []string{"missing b"},
	}, {
		name: "a number repeated, a previous id that is not the one before, an older generation after a newer",
		st: verify.State{FirstSequence: 1, Students: []studentv1.Student{a1},
			Events: []verify.Event{event(1, created, "a1", a1, 1, ""), event(2, updated, "a2", a2, 2, "a1"), event(3, updated, "a3", a1, 2, "x")}},
		want: []string{"gap a", "out of order a"},
	}, {
		name: "a change after deleted; back in scope as created is none",
		st: verify.State{FirstSequence: 1, Students: []studentv1.Student{a2},
			Events: []verify.Event{event(1, created, "a1", a1, 1, ""), event(2, deleted, "ad", a1, 2, "a1"), event(3, updated, "a2", a2, 3, "ad")}},
		want: []string{"out of order a"},
	}, {
		name: "a copy of an event is a duplicate, not a gap",
		st: verify.State{FirstSequence: 1, Students: []studentv1.Student{a1},
			Events: []verify.Event{event(1, created, "a1", a1, 1, ""), event(9, created, "a1", a1, 1, "")}},
		want: []string{"duplicate a"},
	}, {
		name: "foreign: a message that is no Student CloudEvent, an event whose id the bridge would not give it",
		st: verify.State{FirstSequence: 1, Students: []studentv1.Student{a1},
			Unreadable: []verify.Message{{StreamSequence: 2, Subject: "student.updated", Reason: "no content type"}},
			Events:     []verify.Event{event(1, created, "a1", a1, 1, ""), foreign(3, updated, "made-up", a2, 2, id("a1"))}},
		want: []string{"foreign ", "foreign a"},
	}, {
		name: "a first event whose record was pending names it, its id does not",
		st: verify.State{FirstSequence: 1, Students: []studentv1.Student{a2},
			Events: []verify.Event{event(1, created, "a1", a1, 1, ""), foreign(2, updated, contract.EventID(updated, &a2, ""), a2, 2, id("a1"))}},
	}, {
		name: "events of a bridge that did not count, then counted ones",
		st: verify.State{FirstSequence: 1, Students: []studentv1.Student{a2},
			Events: []verify.Event{event(1, created, "a1", a1, 0, ""), event(2, updated, "a2", a2, 1, "a1")}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			r := verify.Check(tc.st, tc.o)
			var got []string
			for _, f := range r.Findings {
				got = append(got, string(f.Kind)+" "+f.Name)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("findings %q, want %q (%+v)", got, tc.want, r.Findings)
			}
			// Every kind but unknown is drift (verify's exit status 1).
			drift := 0
			for _, w := range tc.want {
				if !strings.HasPrefix(w, string(verify.Unknown)+" ") {
					drift++
				}
			}
			if n := len(r.Drift()); n != drift || (drift == 0) != (r.Err() == nil) {
				t.Errorf("%d findings are drift (error %v), want %d", n, r.Err(), drift)
			}
		})
	}
}

func held(s studentv1.Student) studentv1.Student {
	now := metav1.Now()
	s.DeletionTimestamp = &now
	s.Finalizers = []string{"example.com/other"}
	return s
}

func labelled(s studentv1.Student, key, value string) studentv1.Student {
	s.Labels = map[string]string{key: value}
	return s
}
