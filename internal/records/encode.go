package records

import (
	"bytes"
	"encoding/json"
	"fmt"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// encode is rec as the record store holds it: json.Marshal's encoding,
// except that a reserved event (rec.Event, the CloudEvent as JSON) is
// copied in as it is. json.Marshal would scan the event once more to
// validate and compact it; it comes from the CloudEvents SDK's encoder,
// compact already, and it is the very bytes that are published, so the
// record holds those.
func encode(rec studentv1.StudentRecord) ([]byte, error) {
	event := rec.Event
	rec.Event = nil
	head, err := json.Marshal(rec)
	if err != nil || len(event) == 0 {
		return head, err
	}
	if event[0] != '{' || event[len(event)-1] != '}' || !bytes.HasSuffix(head, []byte("}")) {
		return nil, fmt.Errorf("record of %s: its event is not a JSON object", rec.UID)
	}
	// The event is the record's last field: it goes before the closing
	// brace, where json.Marshal puts it.
	out := make([]byte, 0, len(head)+len(`,"event":`)+len(event))
	out = append(out, head[:len(head)-1]...)
	out = append(out, `,"event":`...)
	out = append(out, event...)
	return append(out, '}'), nil
}
