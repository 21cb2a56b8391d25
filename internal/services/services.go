// Package services is `student-bridge services`: per business service, how
// far its consumer is behind the stream and how many Students it has
// applied, from the record store (what was published) and the receipts
// (what each service applied).
package services

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/natssink"
)

// Options say where to look.
type Options struct {
	Stream         string
	RecordsBucket  string
	ReceiptsBucket string
	// Expected services are listed even without a consumer or receipt.
	Expected []string
	// Cluster, on a fleet's hub, is the cluster whose Students are
	// counted: its record store is read through its JetStream domain, and
	// only its receipts (keys <cluster>.<service>.<uid>) count.
	Cluster string
}

// Row is one service.
type Row struct {
	Service string
	// Consumer is false when the stream has no durable consumer named
	// after the service; Pending and AckedSequence are then 0.
	Consumer      bool
	Pending       uint64
	AckedSequence uint64
	InSync        int
	Behind        int
	Failed        int
}

// Report computes a Row per service: every expected one, every one with
// receipts, every durable consumer of the stream.
func Report(ctx context.Context, nc *nats.Conn, o Options) ([]Row, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	published, err := loadPublished(ctx, nc, o.RecordsBucket, o.Cluster)
	if err != nil {
		return nil, err
	}
	receipts, err := loadReceipts(ctx, nc, o.ReceiptsBucket, o.Cluster)
	if err != nil {
		return nil, err
	}
	names := append([]string(nil), o.Expected...)
	for name := range receipts {
		names = append(names, name)
	}
	stream, err := js.Stream(ctx, o.Stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", o.Stream, err)
	}
	consumers := map[string]*jetstream.ConsumerInfo{}
	list := stream.ListConsumers(ctx)
	for info := range list.Info() {
		if info.Config.Durable != "" && studentv1.ValidServiceName(info.Config.Durable) {
			consumers[info.Config.Durable] = info
			names = append(names, info.Config.Durable)
		}
	}
	if err := list.Err(); err != nil {
		return nil, fmt.Errorf("list the consumers of %s: %w", o.Stream, err)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	var rows []Row
	for _, name := range names {
		r := Row{Service: name}
		if info, ok := consumers[name]; ok {
			r.Consumer, r.Pending, r.AckedSequence = true, info.NumPending+uint64(info.NumAckPending), info.AckFloor.Stream
		}
		for uid, eventID := range published {
			state := studentv1.ServiceBehind // no receipt yet
			if rec, ok := receipts[name][uid]; ok {
				state = rec.State(eventID)
			}
			switch state {
			case studentv1.ServiceFailed:
				r.Failed++
			case studentv1.ServiceInSync:
				r.InSync++
			default:
				r.Behind++
			}
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// Print writes rows as a table.
func Print(w io.Writer, rows []Row) error {
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tPENDING\tACKED-SEQ\tIN-SYNC\tBEHIND\tFAILED")
	for _, r := range rows {
		pending, acked := "-", "-"
		if r.Consumer {
			pending, acked = fmt.Sprint(r.Pending), fmt.Sprint(r.AckedSequence)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\n", r.Service, pending, acked, r.InSync, r.Behind, r.Failed)
	}
	return tw.Flush()
}

// loadPublished reads the record store: the last event id published per
// Student that exists (deleted ones left out).
func loadPublished(ctx context.Context, nc *nats.Conn, bucket, domain string) (map[string]string, error) {
	out := map[string]string{}
	err := eachKey(ctx, nc, natssink.BucketConfig{Name: bucket, Domain: domain}, func(key string, value []byte) {
		var rec studentv1.StudentRecord
		if json.Unmarshal(value, &rec) == nil && rec.Published.Type != studentv1.EventTypeDeleted && rec.Published.ID != "" {
			out[string(rec.UID)] = rec.Published.ID
		}
	})
	return out, err
}

// loadReceipts reads the receipts bucket: service -> uid -> receipt; with
// cluster, only the receipts of that cluster's Students.
func loadReceipts(ctx context.Context, nc *nats.Conn, bucket, cluster string) (map[string]map[string]studentv1.Receipt, error) {
	out := map[string]map[string]studentv1.Receipt{}
	err := eachKey(ctx, nc, natssink.BucketConfig{Name: bucket}, func(key string, value []byte) {
		rec, err := studentv1.ParseReceipt(key, value)
		if err != nil || (cluster != "" && rec.Cluster != cluster) {
			return
		}
		if out[rec.Service] == nil {
			out[rec.Service] = map[string]studentv1.Receipt{}
		}
		out[rec.Service][rec.UID] = rec
	})
	return out, err
}

// eachKey calls fn with every key of bucket and its value.
func eachKey(ctx context.Context, nc *nats.Conn, bucket natssink.BucketConfig, fn func(key string, value []byte)) error {
	kv, err := natssink.EnsureBucket(ctx, nc, bucket, false)
	if err != nil {
		return err
	}
	recs, err := kv.Load(ctx)
	if err != nil {
		return fmt.Errorf("read bucket %s: %w", bucket.Name, err)
	}
	for _, r := range recs {
		fn(r.Key, r.Value)
	}
	return nil
}
