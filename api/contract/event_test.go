package contract_test

import (
	"encoding/json"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

func student(gen int64, school string, labels map[string]string) *studentv1.Student {
	return &studentv1.Student{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "object-name", UID: "uid-1", Generation: gen, ResourceVersion: "42", Labels: labels},
		Spec:       studentv1.StudentSpec{Name: "wang", School: school},
	}
}

func TestNextChange(t *testing.T) {
	now := metav1.Now()
	deleting := student(2, "china", nil)
	deleting.DeletionTimestamp = &now
	published := func(typ string, gen int64, labels map[string]string) *studentv1.PublishedEvent {
		return &studentv1.PublishedEvent{Type: typ, Generation: gen, Labels: labels}
	}
	cases := []struct {
		name string
		s    *studentv1.Student
		last *studentv1.PublishedEvent
		want string
	}{
		{"never published", student(1, "china", nil), nil, studentv1.EventTypeCreated},
		{"published, unchanged", student(1, "china", nil), published(studentv1.EventTypeCreated, 1, nil), ""},
		{"spec changed", student(2, "china", nil), published(studentv1.EventTypeCreated, 1, nil), studentv1.EventTypeUpdated},
		{"label added", student(1, "china", map[string]string{"a": "b"}), published(studentv1.EventTypeCreated, 1, nil), studentv1.EventTypeUpdated},
		{"label value changed", student(1, "china", map[string]string{"a": "c"}), published(studentv1.EventTypeUpdated, 1, map[string]string{"a": "b"}), studentv1.EventTypeUpdated},
		{"empty and nil labels are the same", student(1, "china", map[string]string{}), published(studentv1.EventTypeCreated, 1, nil), ""},
		{"back after leaving the scope, unchanged", student(1, "china", nil), published(studentv1.EventTypeDeleted, 1, nil), studentv1.EventTypeCreated},
		{"deleting", deleting, published(studentv1.EventTypeUpdated, 1, nil), studentv1.EventTypeDeleted},
		{"deleting, never published", deleting, nil, studentv1.EventTypeDeleted},
		{"deleting, delete already published", deleting, published(studentv1.EventTypeDeleted, 2, nil), ""},
		{"a cache behind what was published", student(1, "china", nil), published(studentv1.EventTypeUpdated, 3, nil), ""},
		{"a cache behind a published delete", student(1, "china", nil), published(studentv1.EventTypeDeleted, 2, nil), ""},
	}
	for _, tc := range cases {
		if got := contract.NextChange(tc.s, tc.last); got != tc.want {
			t.Errorf("%s: NextChange = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestEventID(t *testing.T) {
	base := contract.EventID(studentv1.EventTypeUpdated, student(2, "china", map[string]string{"a": "b", "c": "d"}), "prev")
	if len(base) != 32 {
		t.Fatalf("id %q is not 32 hex digits", base)
	}
	same := []struct {
		name string
		id   string
	}{
		{"same change again", contract.EventID(studentv1.EventTypeUpdated, student(2, "china", map[string]string{"c": "d", "a": "b"}), "prev")},
	}
	for _, c := range same {
		if c.id != base {
			t.Errorf("%s: id %s, want %s", c.name, c.id, base)
		}
	}
	rv := student(2, "china", map[string]string{"a": "b", "c": "d"})
	rv.ResourceVersion = "99" // e.g. the bridge's own status write in between
	if id := contract.EventID(studentv1.EventTypeUpdated, rv, "prev"); id != base {
		t.Errorf("resourceVersion changed the id: %s", id)
	}
	otherUID := student(2, "china", map[string]string{"a": "b", "c": "d"})
	otherUID.UID = "uid-2"
	differ := []struct {
		name string
		id   string
	}{
		{"other type", contract.EventID(studentv1.EventTypeCreated, student(2, "china", map[string]string{"a": "b", "c": "d"}), "prev")},
		{"other generation", contract.EventID(studentv1.EventTypeUpdated, student(3, "china", map[string]string{"a": "b", "c": "d"}), "prev")},
		{"other labels", contract.EventID(studentv1.EventTypeUpdated, student(2, "china", map[string]string{"a": "b"}), "prev")},
		{"other previous event", contract.EventID(studentv1.EventTypeUpdated, student(2, "china", map[string]string{"a": "b", "c": "d"}), "prev2")},
		{"other object", contract.EventID(studentv1.EventTypeUpdated, otherUID, "prev")},
	}
	for _, c := range differ {
		if c.id == base {
			t.Errorf("%s: same id %s", c.name, base)
		}
	}
	// A delete is one event per object, whatever state it ends in.
	d1 := contract.EventID(studentv1.EventTypeDeleted, student(2, "china", nil), "a")
	d2 := contract.EventID(studentv1.EventTypeDeleted, student(5, "x", map[string]string{"z": "z"}), "b")
	if d1 != d2 {
		t.Errorf("deleted ids differ: %s %s", d1, d2)
	}
}

// TestEventIDIsStable pins ids to the bytes they hash (computed apart from
// the bridge): a change published again after an upgrade, within the
// stream's duplicate window, must carry the id the old version gave it, or
// JetStream stores it twice.
func TestEventIDIsStable(t *testing.T) {
	for _, c := range []struct {
		typ, prev, want string
		s               *studentv1.Student
	}{
		// the first 16 bytes of the SHA-256 of uid-1, the type, 2, wang,
		// china, a=b, c=d (each followed by a NUL byte) and prev
		{studentv1.EventTypeUpdated, "prev", "5b365dbdbbee4fcc23d0f92ae563f23f", student(2, "china", map[string]string{"c": "d", "a": "b"})},
		{studentv1.EventTypeCreated, "", "54f97e8e7cad89d7838fba86c737c1b3", student(1, "china", nil)},
		{studentv1.EventTypeDeleted, "prev", "008572669205f5dc6544adcca607fb6d", student(7, "x", map[string]string{"a": "b"})},
	} {
		if got := contract.EventID(c.typ, c.s, c.prev); got != c.want {
			t.Errorf("EventID(%s, generation %d, %q) = %s, want %s", c.typ, c.s.Generation, c.prev, got, c.want)
		}
	}
}

func TestNewEvent(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.FixedZone("CST", 8*3600))
	prev := &studentv1.PublishedEvent{Type: studentv1.EventTypeCreated, ID: "p", Spec: studentv1.StudentSpec{Name: "wang", School: "old"}}
	cases := []struct {
		typ          string
		last         *studentv1.PublishedEvent
		wantPrevious bool
	}{
		{studentv1.EventTypeCreated, nil, false},
		{studentv1.EventTypeUpdated, prev, true},
		{studentv1.EventTypeDeleted, prev, false},
	}
	for _, tc := range cases {
		s := student(2, "new", map[string]string{"grade": "3"})
		ev, err := contract.NewEvent("prod", tc.typ, "the-id", s, tc.last, now)
		if err != nil {
			t.Fatal(err)
		}
		if ev.SpecVersion() != "1.0" || ev.Type() != tc.typ || ev.ID() != "the-id" ||
			ev.Source() != "/clusters/prod/apis/example.k8s.io/v1/students" || ev.Subject() != "default/object-name" ||
			!ev.Time().Equal(now) || ev.Time().Location() != time.UTC || ev.DataContentType() != "application/json" {
			t.Errorf("%s: attributes %s", tc.typ, ev)
		}
		var data studentv1.StudentEventData
		if err := json.Unmarshal(ev.Data(), &data); err != nil {
			t.Fatal(err)
		}
		want := studentv1.EventObjectMeta{Namespace: "default", Name: "object-name", UID: "uid-1", Generation: 2, ResourceVersion: "42", Labels: map[string]string{"grade": "3"}}
		if data.Metadata.Name != want.Name || data.Metadata.UID != want.UID || data.Metadata.Generation != 2 || data.Metadata.ResourceVersion != "42" || data.Metadata.Labels["grade"] != "3" {
			t.Errorf("%s: metadata %+v", tc.typ, data.Metadata)
		}
		if data.Spec != s.Spec {
			t.Errorf("%s: spec %+v", tc.typ, data.Spec)
		}
		if (data.PreviousSpec != nil) != tc.wantPrevious || (tc.wantPrevious && *data.PreviousSpec != prev.Spec) {
			t.Errorf("%s: previousSpec %+v", tc.typ, data.PreviousSpec)
		}
	}
}
