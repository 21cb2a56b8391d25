package contract

import (
	"encoding/json"

	"k8s.io/apimachinery/pkg/types"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// RecordKey is the key of a Student's record in the record store: its uid.
func RecordKey(uid types.UID) string { return string(uid) }

// ParseRecord reads a record store entry: ok is false for a key that holds
// no record of a Student under its uid (another key, e.g. the shard count,
// or a value that is not ours to interpret).
func ParseRecord(key string, value []byte) (rec studentv1.StudentRecord, ok bool) {
	if err := json.Unmarshal(value, &rec); err != nil || rec.UID == "" || RecordKey(rec.UID) != key {
		return studentv1.StudentRecord{}, false
	}
	return rec, true
}
