package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// Reporter writes a service's receipts into the receipts bucket, where the
// bridge reads them and shows them on the Student. A Mirror reports by
// itself; a service that applies changes another way reports by hand.
type Reporter struct {
	service string
	kv      jetstream.KeyValue
}

// key is where the receipt of the Student uid of cluster goes: the hub's
// key when cluster is set.
func (p *Reporter) key(cluster, uid string) string {
	if cluster != "" {
		return studentv1.FleetReceiptKey(cluster, p.service, uid)
	}
	return studentv1.ReceiptKey(p.service, uid)
}

// NewReporter opens the receipts bucket on nc for service, as NewMirror
// takes nc: studentv1.ReceiptsBucket when bucket is empty (the bridge
// creates it).
func NewReporter(ctx context.Context, nc *nats.Conn, service, bucket string) (*Reporter, error) {
	if !studentv1.ValidServiceName(service) {
		return nil, fmt.Errorf("consumer: service name %q: use letters, digits, '-' and '_' (up to 63)", service)
	}
	if bucket == "" {
		bucket = studentv1.ReceiptsBucket
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("consumer: receipts bucket %s (the bridge creates it): %w", bucket, err)
	}
	return &Reporter{service: service, kv: kv}, nil
}

// Report writes r as the service's receipt for r.UID; r.Service is set to
// the reporter's service. A receipt naming r.Cluster goes to the hub's key
// (studentv1.FleetReceiptKey): report it so into a hub's receipts bucket.
func (p *Reporter) Report(ctx context.Context, r studentv1.Receipt) error {
	r.Service = p.service
	if len(r.Message) > studentv1.MaxReceiptMessage {
		r.Message = r.Message[:studentv1.MaxReceiptMessage-3] + "..."
	}
	if err := r.Validate(""); err != nil {
		return fmt.Errorf("consumer: receipt: %w", err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := p.kv.Put(ctx, p.key(r.Cluster, r.UID), b); err != nil {
		return fmt.Errorf("consumer: write receipt of %s/%s: %w", r.Namespace, r.Name, err)
	}
	return nil
}

// Applied returns the event id of the service's receipt for uid if it
// reports that event applied, "" otherwise.
func (p *Reporter) Applied(ctx context.Context, uid string) (string, error) {
	return p.AppliedIn(ctx, "", uid)
}

// AppliedIn is Applied for a Student of cluster, in a hub's bucket (with
// cluster empty, Applied).
func (p *Reporter) AppliedIn(ctx context.Context, cluster, uid string) (string, error) {
	e, err := p.kv.Get(ctx, p.key(cluster, uid))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	r, err := studentv1.ParseReceipt(e.Key(), e.Value())
	if err != nil || r.Result != studentv1.ResultApplied {
		return "", nil
	}
	return r.EventID, nil
}

// Forget removes the service's receipt for uid (its Student is deleted).
func (p *Reporter) Forget(ctx context.Context, uid string) error { return p.ForgetIn(ctx, "", uid) }

// ForgetIn is Forget for a Student of cluster, in a hub's bucket (with
// cluster empty, Forget).
func (p *Reporter) ForgetIn(ctx context.Context, cluster, uid string) error {
	if err := p.kv.Delete(ctx, p.key(cluster, uid)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	return nil
}
