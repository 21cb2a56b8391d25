package reconciler

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/records"
	"github.com/student-bridge/student-bridge/sink"
)

// Snapshotter publishes a snapshot event (type EventTypeSnapshot, subject
// student.snapshot) with the current state of every Student, so a new
// consumer can rebuild the desired state without the whole history.
type Snapshotter struct {
	// Reader lists Students; the manager's cached client.
	Reader client.Reader
	Sink   sink.Sink
	// Cluster names the cluster in the CloudEvent source.
	Cluster string
	// Now returns the current time; time.Now when nil.
	Now func() time.Time
	// Records, when set, gives each snapshot the sequence and id of the
	// last change published for its Student, read from the record store
	// (where every replica's records are) once per snapshot.
	Records *records.Set
}

// SnapshotResult is what a snapshot published.
type SnapshotResult struct {
	// Published counts its events.
	Published int
	// FirstSequence is the stream sequence of its first event (0: none,
	// or the sink does not store).
	FirstSequence uint64
}

// Snapshot publishes one snapshot event per Student in namespace (all
// namespaces when empty) and says how many it published, from where. Students being
// deleted are left out: their deleted event is on its way. run identifies
// this snapshot; events of one run share it in their ids, so retrying a run
// does not duplicate events within the stream's window, while a new run is
// published in full.
func (s *Snapshotter) Snapshot(ctx context.Context, namespace, run string) (SnapshotResult, error) {
	var res SnapshotResult
	var list studentv1.StudentList
	if err := s.Reader.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return res, fmt.Errorf("list students: %w", err)
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	published := map[types.UID]studentv1.PublishedEvent{}
	if s.Records != nil {
		stored, err := s.Records.Stored(ctx)
		if err != nil {
			return res, err
		}
		for _, rec := range stored {
			if !rec.Pending {
				published[rec.UID] = rec.Published
			}
		}
	}
	for i := range list.Items {
		stu := &list.Items[i]
		if !stu.DeletionTimestamp.IsZero() {
			continue
		}
		ev, err := contract.NewEvent(s.Cluster, studentv1.EventTypeSnapshot, snapshotID(stu, run), stu, nil, now())
		if err != nil {
			return res, err
		}
		if last, ok := published[stu.UID]; ok {
			contract.Chain(&ev, contract.Sequence(studentv1.EventTypeSnapshot, &last), last.ID)
		}
		receipt, err := send(ctx, s.Sink, ev, nil)
		if err != nil {
			return res, fmt.Errorf("publish snapshot of %s: %w", contract.Subject(stu), err)
		}
		if res.FirstSequence == 0 || (receipt.Sequence > 0 && receipt.Sequence < res.FirstSequence) {
			res.FirstSequence = receipt.Sequence
		}
		res.Published++
	}
	return res, nil
}

func snapshotID(s *studentv1.Student, run string) string {
	h := sha256.Sum256([]byte(string(s.UID) + "\x00snapshot\x00" + s.ResourceVersion + "\x00" + run))
	return hex.EncodeToString(h[:16])
}
