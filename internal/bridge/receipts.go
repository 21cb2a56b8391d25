package bridge

import (
	"context"
	"fmt"
	"sync"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/fleet"
	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/internal/statusview"
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
	log   logr.Logger
}

// NeedLeaderElection is true: only the leader writes status.
func (w *receiptWatch) NeedLeaderElection() bool { return true }

func (w *receiptWatch) Start(ctx context.Context) error {
	if !w.mgr.GetCache().WaitForCacheSync(ctx) {
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
		purging.Do(func() { go purgeDeleteMarkers(ctx, store, w.cfg.Records.DeleteMarkerAge, w.log) })
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
