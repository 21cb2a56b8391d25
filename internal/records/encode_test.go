package records

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// TestEncodeIsMarshal: a record encodes as json.Marshal encodes it, with
// and without a reserved event, and reads back as it was.
func TestEncodeIsMarshal(t *testing.T) {
	rec := studentv1.StudentRecord{
		Namespace: "ns", Name: "wang", UID: "u-1",
		Published: studentv1.PublishedEvent{
			Type: studentv1.EventTypeUpdated, ID: "id-1", Time: metav1.NewTime(time.Date(2026, 12, 7, 1, 2, 3, 0, time.UTC)),
			Generation: 3, Sequence: 9, StudentSequence: 4,
			Spec:   studentv1.StudentSpec{Name: "wang", School: `"quoted" \ school`},
			Labels: map[string]string{"b": "2", "a": "1"},
		},
	}
	reserved := rec
	reserved.Pending = true
	reserved.Event = json.RawMessage(`{"specversion":"1.0","id":"id-1","data":{"school":"\"quoted\" \\ school"}}`)
	for _, r := range []studentv1.StudentRecord{rec, reserved} {
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := encode(r)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("encode:\n%s\njson.Marshal:\n%s", got, want)
		}
		var back studentv1.StudentRecord
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("%s does not read back: %v", got, err)
		}
		if !bytes.Equal(back.Event, r.Event) || back.Published.StudentSequence != r.Published.StudentSequence {
			t.Errorf("read back %+v, want %+v", back, r)
		}
	}
	reserved.Event = json.RawMessage(`"not an object"`)
	if _, err := encode(reserved); err == nil {
		t.Error("a record whose event is not a JSON object was encoded")
	}
}
