package statusview

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// TestTrimStatus: the cache drops the Published message only where it
// says what lastPublished does; any other message is kept, so a status
// whose message differs from its view still differs trimmed. The
// caller's conditions stay whole.
func TestTrimStatus(t *testing.T) {
	last := &studentv1.PublishedEvent{Type: studentv1.EventTypeCreated, ID: "0123abcd", Sequence: 42,
		Spec: studentv1.StudentSpec{Name: "wang", School: "china"}, Labels: map[string]string{"a": "b"}}
	for _, tc := range []struct {
		reason, message, want string
	}{
		{studentv1.ReasonPublished, publishedMessage(last), ""},
		{studentv1.ReasonPublished, studentv1.EventTypeCreated + " 0123abcd published as stream sequence 4", studentv1.EventTypeCreated + " 0123abcd published as stream sequence 4"},
		{studentv1.ReasonPublished, studentv1.EventTypeCreated + " 0123abcd published as stream sequence 420", studentv1.EventTypeCreated + " 0123abcd published as stream sequence 420"},
		{studentv1.ReasonPublished, "edited by hand", "edited by hand"},
		{"Pending", publishedMessage(last), publishedMessage(last)},
	} {
		conds := []metav1.Condition{{Type: studentv1.ConditionPublished, Status: metav1.ConditionTrue, Reason: tc.reason, Message: tc.message}}
		got := TrimStatus(studentv1.StudentStatus{LastPublished: last, Conditions: conds})
		if m := got.Conditions[0].Message; m != tc.want {
			t.Errorf("reason %s, message %q: trimmed to %q, want %q", tc.reason, tc.message, m, tc.want)
		}
		if conds[0].Message != tc.message {
			t.Errorf("reason %s, message %q: the caller's condition became %q", tc.reason, tc.message, conds[0].Message)
		}
		if got.LastPublished.Spec != (studentv1.StudentSpec{}) || got.LastPublished.Labels != nil || last.Labels == nil {
			t.Errorf("lastPublished trimmed to %+v (the caller's: %+v), want no spec nor labels, the caller's whole", got.LastPublished, last)
		}
	}
}
