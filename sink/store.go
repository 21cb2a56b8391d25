package sink

import (
	"context"
	"errors"

	cloudevents "github.com/cloudevents/sdk-go/v2"
)

// Sentinel errors a Store wraps.
var (
	// ErrNotFound: the key has no record.
	ErrNotFound = errors.New("sink: record not found")
	// ErrConflict: the record changed since the revision the caller knew
	// (or already exists, for a create). Someone else writes this key: read
	// it again before deciding anything.
	ErrConflict = errors.New("sink: record changed by another writer")
)

// Record is one entry of a Store.
type Record struct {
	// Key identifies the record.
	Key string
	// Value is the record's content, opaque to the store.
	Value []byte
	// Revision is the store's version of the record; Put and Delete take it
	// to detect writes by someone else.
	Revision uint64
	// EventSequence is, for a record a Committer stored with its event,
	// the event's stream sequence; 0 otherwise.
	EventSequence uint64
}

// Store keeps what the bridge published, next to the events themselves, so
// that a restart, a catch-up after downtime and a handover between replicas
// read it without asking the Kubernetes API server. Every write is a
// compare-and-set on the record's revision, so two writers can never
// overwrite each other silently. A Store is safe for concurrent use.
type Store interface {
	// Load returns every record.
	Load(ctx context.Context) ([]Record, error)
	// Get returns the latest record of key (what the last successful Put
	// wrote, never an older one), or an error wrapping ErrNotFound.
	Get(ctx context.Context, key string) (Record, error)
	// Put writes value under key if the record is still at revision (0:
	// if there is no record) and returns the new revision; otherwise it
	// returns an error wrapping ErrConflict.
	Put(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
	// Delete removes the record of key if it is still at revision;
	// otherwise it returns an error wrapping ErrConflict. Deleting a
	// record that does not exist is not an error.
	Delete(ctx context.Context, key string, revision uint64) error
}

// Committer is a Store that also stores an event with its record in one
// write: both or neither (records kept in the events' stream, written as
// one atomic batch). With it, no moment exists at which an event is out
// and its record is not.
type Committer interface {
	Store
	// Commit stores event and, under key, the record value if the record
	// is still at revision (0: no record yet). It returns the event's
	// receipt and the record's new revision. If the record changed (or the
	// stream holds the event already, and so its record), nothing is
	// stored and the error wraps ErrConflict.
	Commit(ctx context.Context, event cloudevents.Event, key string, value []byte, revision uint64) (Receipt, uint64, error)
}
