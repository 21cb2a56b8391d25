package bridge

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/fleet"
	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/internal/records"
	"github.com/student-bridge/student-bridge/internal/statusview"
	"github.com/student-bridge/student-bridge/reconciler"
	"github.com/student-bridge/student-bridge/sink"
)

// receiptWatch follows the receipts bucket while this replica leads: every
// receipt a service writes updates the Student's status view, a failure
// raises a Warning Event, and receipts that cannot be shown are skipped
// with a metric and a log line naming their key.
type receiptWatch struct {
	nc  *nats.Conn
	cfg *config.Config
	mgr manager.Manager
	// parts are the reconciler's receipts, status writer and recorder.
	parts *reconcilerParts
	// recs are the records, whose store says whether a Student is gone.
	recs *records.Set
	log  logr.Logger
}

// NeedLeaderElection is true: only the leader writes status.
func (w *receiptWatch) NeedLeaderElection() bool { return true }

func (w *receiptWatch) Start(ctx context.Context) error {
	if !reconciler.WaitForStudents(ctx, w.mgr.GetCache()) {
		return nil
	}
	bucket := natssink.BucketConfig{Name: w.cfg.Receipts.Bucket, Storage: w.cfg.Records.Storage, Replicas: w.cfg.Records.Replicas,
		Timeout: w.cfg.NATS.AckTimeout, Description: "What business services applied, per service and Student uid"}
	if f := w.cfg.Fleet; f.HubDomain != "" {
		bucket.Source = fleet.ReceiptsSource(f.HubDomain, f.ReceiptsBucket, w.cfg.Cluster, bucket.Name)
	}
	var purging sync.Once
	err := retry(ctx, w.log, "receipts watch", func(ctx context.Context) error {
		if !w.nc.IsConnected() {
			return fmt.Errorf("NATS %s", w.nc.Status())
		}
		setup, cancel := context.WithTimeout(ctx, setupTimeout)
		defer cancel()
		store, err := natssink.EnsureBucket(setup, w.nc, bucket, w.cfg.Receipts.Create)
		if err != nil {
			return err
		}
		w.parts.receipts.SetStore(store)
		// A deleted Student's receipts are removed (statusview.Receipts'
		// Forget), each leaving a delete marker.
		purging.Do(func() {
			go purgeDeleteMarkers(ctx, store, w.cfg.Records.DeleteMarkerAge, w.log)
			go w.sweepEvery(ctx, w.cfg.Records.DeleteMarkerAge)
		})
		return store.Watch(ctx, func(rec sink.Record, deleted bool) { w.apply(ctx, rec, deleted) }, func() {
			w.log.Info("receipts loaded", "bucket", bucket.Name, "receipts", w.parts.receipts.Len())
		})
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("config key receipts.bucket: %w", err)
	}
	return nil
}

// apply takes one update of the bucket.
func (w *receiptWatch) apply(ctx context.Context, rec sink.Record, deleted bool) {
	if deleted {
		if old, ok := w.parts.receipts.Remove(rec.Key); ok {
			statusview.CountReceipt("removed")
			w.parts.status.Enqueue(types.NamespacedName{Namespace: old.Namespace, Name: old.Name})
		}
		return
	}
	receipt, err := studentv1.ParseReceipt(rec.Key, rec.Value)
	if err == nil && receipt.Cluster != "" && receipt.Cluster != w.cfg.Cluster {
		// Another cluster's Student: not ours to show, nor a fault.
		statusview.CountReceipt("otherCluster")
		return
	}
	if err != nil {
		statusview.CountReceipt("malformed")
		w.log.Info("skipping a malformed receipt", "key", rec.Key, "reason", err.Error())
		return
	}
	key := types.NamespacedName{Namespace: receipt.Namespace, Name: receipt.Name}
	var stu studentv1.Student
	if err := w.mgr.GetClient().Get(ctx, key, &stu); err != nil || string(stu.UID) != receipt.UID {
		statusview.CountReceipt("unknownStudent")
		w.log.Info("skipping a receipt of a Student the bridge does not watch", "key", rec.Key, "student", key.String())
		// Most often the receipt of a deleted Student's last event,
		// written after it went: held until the sweep removes it.
		w.parts.receipts.Set(receipt)
		return
	}
	prev := w.parts.receipts.Set(receipt)
	statusview.CountReceipt(receipt.Result)
	if receipt.Result == studentv1.ResultFailed && (prev == nil || prev.Result != receipt.Result || prev.EventID != receipt.EventID || prev.Message != receipt.Message) {
		w.parts.recorder.Eventf(&stu, nil, corev1.EventTypeWarning, studentv1.ReasonServiceFailed, "Apply",
			"service %s failed to apply event %s (generation %d): %s", receipt.Service, receipt.EventID, receipt.Generation, receipt.Message)
	}
	w.parts.status.Enqueue(key)
}

// sweepEvery removes, now and every period until ctx ends, the receipts
// of Students that are gone (sweep).
func (w *receiptWatch) sweepEvery(ctx context.Context, period time.Duration) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		if err := w.recs.Wait(ctx); err != nil {
			return
		}
		if n, err := w.sweep(ctx); err != nil && ctx.Err() == nil {
			w.log.Info("removing the receipts of gone Students failed; tried again later", "removed", n, "reason", err.Error(), "in", period.String())
		} else if n > 0 {
			w.log.V(1).Info("removed the receipts of gone Students", "students", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// sweep removes the receipts of every Student that is gone, from the view
// and the bucket, and returns how many Students' it removed. The
// reconciler removes a Student's receipts with its record, on the replica
// that holds its shard; a receipt the leader holds past that (the
// replica removing them did not know them, or the service's receipt of
// the deleted event came after) is the sweep's. A Student is gone when
// the cache has no Student of its uid and the record store no record:
// a Student's first event is published only after its record is written,
// so a receipt of a Student that is still there always finds one.
func (w *receiptWatch) sweep(ctx context.Context) (int, error) {
	removed := 0
	for uid, key := range w.parts.receipts.Students() {
		var stu studentv1.Student
		err := w.mgr.GetClient().Get(ctx, key, &stu)
		if err == nil && string(stu.UID) == uid {
			continue
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return removed, err
		}
		held, err := w.recs.InStore(ctx, types.UID(uid))
		if err != nil {
			return removed, err
		}
		if held {
			continue
		}
		if err := w.parts.receipts.Forget(ctx, uid); err != nil {
			return removed, err
		}
		removed++
	}
	return removed, nil
}
