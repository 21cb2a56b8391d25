package v1_test

import (
	"encoding/json"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// FuzzParseReceipt: whatever a service (any writer with the permission)
// puts in the receipts bucket, ParseReceipt returns a receipt that is
// valid for its key, or an error; never a panic. A valid one survives
// being written again.
func FuzzParseReceipt(f *testing.F) {
	f.Add("roster.u1", []byte(`{"service":"roster","uid":"u1","namespace":"default","name":"wang","eventID":"e1","generation":1,"result":"applied","time":"2026-01-02T03:04:05Z"}`))
	f.Add("west.roster.u1", []byte(`{"service":"roster","uid":"u1","cluster":"west","namespace":"ns","name":"n","eventID":"e","result":"failed","message":"full","traceID":"0af7651916cd43dd8448eb211c80319c"}`))
	f.Add("roster.u1", []byte(`{"service":"roster","uid":"u.1"}`))
	f.Add("", []byte(`null`))
	f.Add("x", []byte(`{"generation":"one"}`))
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		rec, err := studentv1.ParseReceipt(key, value)
		if err != nil {
			return
		}
		if rec.Validate(key) != nil {
			t.Fatalf("ParseReceipt accepted %q as %+v, which does not validate", value, rec)
		}
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatalf("an accepted receipt does not encode: %v", err)
		}
		if _, err := studentv1.ParseReceipt(key, b); err != nil {
			t.Fatalf("an accepted receipt, written again, is refused: %v\n%s", err, b)
		}
	})
}

// FuzzParseSnapshotRequest: any request body gives a request for all
// namespaces or for a valid namespace name, or an error; never a panic.
func FuzzParseSnapshotRequest(f *testing.F) {
	f.Add([]byte(``))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"namespace":"default"}`))
	f.Add([]byte(`{"namespace":"../etc"}`))
	f.Add([]byte(`{"namespace":1}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := studentv1.ParseSnapshotRequest(body)
		if err != nil {
			return
		}
		if req.Namespace != "" && len(validation.IsDNS1123Label(req.Namespace)) > 0 {
			t.Fatalf("accepted namespace %q", req.Namespace)
		}
	})
}
