package contract_test

import (
	"encoding/json"
	"testing"

	"github.com/student-bridge/student-bridge/api/contract"
)

// FuzzParseRecord: whatever the record store's bucket holds under a key
// (a record of another version, a value written by hand), ParseRecord
// returns a record of the Student the key names, or nothing; never a
// panic. A record it returns survives being written again.
func FuzzParseRecord(f *testing.F) {
	f.Add("u1", []byte(`{"namespace":"default","name":"wang","uid":"u1","published":{"type":"io.k8s.example.student.created","id":"e1","generation":1,"sequence":3,"studentSequence":1,"spec":{"name":"wang","school":"china"}}}`))
	f.Add("u1", []byte(`{"namespace":"default","name":"wang","uid":"u1","pending":true,"published":{"type":"io.k8s.example.student.created","id":"e1"}}`))
	f.Add("u1", []byte(`{"uid":"u2"}`))
	f.Add("u1", []byte(`{"uid":"u1","published":{"generation":"x"}}`))
	f.Add("", []byte(`null`))
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		rec, ok := contract.ParseRecord(key, value)
		if !ok {
			return
		}
		if string(rec.UID) != key {
			t.Fatalf("the record under %q names uid %q", key, rec.UID)
		}
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatalf("an accepted record does not encode: %v", err)
		}
		if _, ok := contract.ParseRecord(key, b); !ok {
			t.Fatalf("an accepted record, written again, is refused:\n%s", b)
		}
	})
}
