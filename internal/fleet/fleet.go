// Package fleet sets up the NATS side of many clusters fanned into one
// hub (docs/fleet.md): the hub's stream that sources every cluster's
// stream, the hub's receipts bucket, and the source that brings a
// cluster's receipts home from it.
package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/natssink"
)

// Hub configures EnsureHub.
type Hub struct {
	// Clusters are the clusters' names, each its NATS's JetStream domain.
	Clusters []string
	// Stream is the hub's stream; default studentv1.FleetStream.
	Stream string
	// SourceStream is each cluster's stream (the bridges' nats.stream);
	// default studentv1.DefaultStream.
	SourceStream string
	// SubjectPrefix is the bridges' nats.subjectPrefix; default student.
	SubjectPrefix string
	// ReceiptsBucket is the hub's receipts bucket; default
	// studentv1.FleetReceiptsBucket.
	ReceiptsBucket string
	// Storage ("file" or "memory") and Replicas of what is created.
	Storage  string
	Replicas int
}

func (h *Hub) defaults() {
	h.Stream = cmp.Or(h.Stream, studentv1.FleetStream)
	h.SourceStream = cmp.Or(h.SourceStream, studentv1.DefaultStream)
	h.SubjectPrefix = cmp.Or(h.SubjectPrefix, studentv1.DefaultSubjectPrefix)
	h.ReceiptsBucket = cmp.Or(h.ReceiptsBucket, studentv1.FleetReceiptsBucket)
	h.Replicas = cmp.Or(h.Replicas, 1)
}

// Source is how the hub's stream sources cluster's stream: through the
// cluster's JetStream domain, each subject with the cluster inserted after
// the prefix (student.created becomes student.<cluster>.created).
func (h Hub) Source(cluster string) *jetstream.StreamSource {
	h.defaults()
	return &jetstream.StreamSource{
		Name:     h.SourceStream,
		External: &jetstream.ExternalStream{APIPrefix: studentv1.DomainAPI(cluster)},
		SubjectTransforms: []jetstream.SubjectTransformConfig{{
			Source: h.SubjectPrefix + ".>", Destination: studentv1.FleetSubjects(h.SubjectPrefix, cluster),
		}},
	}
}

// EnsureHub creates the hub's stream and receipts bucket where missing and
// adds the sources of clusters the stream does not source yet; it returns
// the clusters added. It never removes a source (a cluster leaving the
// fleet is removed by hand, see docs/fleet.md).
func EnsureHub(ctx context.Context, nc *nats.Conn, h Hub) (added []string, err error) {
	h.defaults()
	for _, c := range h.Clusters {
		if !studentv1.ValidClusterName(c) {
			return nil, fmt.Errorf("cluster %q: use letters, digits, '-' and '_' (up to 63)", c)
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	storage, err := natssink.Storage(h.Storage)
	if err != nil {
		return nil, err
	}
	cfg := jetstream.StreamConfig{Name: h.Stream, Storage: storage, Replicas: h.Replicas,
		Description: "Every cluster's Student events, sourced from each cluster's " + h.SourceStream}
	st, err := js.Stream(ctx, h.Stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
	case err != nil:
		return nil, fmt.Errorf("look up stream %s: %w", h.Stream, err)
	default:
		cfg = st.CachedInfo().Config
	}
	for _, c := range h.Clusters {
		src := h.Source(c)
		if !natssink.HasSource(cfg.Sources, src) {
			cfg.Sources = append(cfg.Sources, src)
			added = append(added, c)
		}
	}
	if st == nil {
		_, err = js.CreateStream(ctx, cfg)
	} else if len(added) > 0 {
		_, err = js.UpdateStream(ctx, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", h.Stream, err)
	}
	_, err = js.KeyValue(ctx, h.ReceiptsBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		_, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: h.ReceiptsBucket, History: 1, Storage: storage, Replicas: h.Replicas,
			Description: "What business services on the hub applied, per cluster, service and Student uid"})
	}
	if err != nil {
		return nil, fmt.Errorf("receipts bucket %s: %w", h.ReceiptsBucket, err)
	}
	return added, nil
}

// ReceiptsSource is how cluster's receipts bucket (local) sources the
// hub's (hubBucket, in the JetStream domain hubDomain): only cluster's
// keys, with the cluster's token taken off (<cluster>.<service>.<uid>
// becomes <service>.<uid>).
func ReceiptsSource(hubDomain, hubBucket, cluster, local string) *jetstream.StreamSource {
	return &jetstream.StreamSource{
		Name:     "KV_" + hubBucket,
		External: &jetstream.ExternalStream{APIPrefix: studentv1.DomainAPI(hubDomain)},
		SubjectTransforms: []jetstream.SubjectTransformConfig{{
			Source: "$KV." + hubBucket + "." + cluster + ".>", Destination: "$KV." + local + ".>",
		}},
	}
}
