package stack

import (
	"context"
	"fmt"
	"net/url"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// LeafNodeDeny lists the subjects a cluster's leaf node connection to the
// hub carries neither way (its deny_imports and deny_exports, as
// deploy/helm/examples/fleet-leaf.yaml sets them). Every cluster's bridge
// publishes to the same subjects and its buckets have the same names: were
// they carried, every cluster's stream and buckets would also capture every
// other cluster's events, records and receipts. Events reach the hub by
// stream sourcing, receipts the cluster by bucket sourcing, both through
// the JetStream domains' APIs; snapshot requests for one cluster
// (student-bridge.snapshot.<cluster>) are carried.
var LeafNodeDeny = []string{"student.>", "$KV.>", "student-bridge.snapshot"}

// Hub is a fleet's hub nats-server, as docs/fleet.md lays it out: with
// JetStream in domain HubDomain, listening for leaf nodes. Each cluster's
// NATS is a leaf node of it (Leaf), in the domain of its cluster's name,
// and its connection to the hub runs through a Link, so a test can cut it.
type Hub struct {
	*NATS
	leafPort int
	links    map[string]*Link
}

// HubDomain is the hub's JetStream domain.
const HubDomain = "hub"

// StartHub starts a hub.
func StartHub() (*Hub, error) {
	port, err := FreePorts(1)
	if err != nil {
		return nil, err
	}
	h := &Hub{leafPort: port, links: map[string]*Link{}}
	h.NATS, err = StartNATS(NATSOptions{Configure: func(o *natsserver.Options) {
		o.ServerName = "hub"
		o.JetStreamDomain = HubDomain
		o.LeafNode.Host = "127.0.0.1"
		o.LeafNode.Port = port
		// Leaf nodes reach the hub only through their links: it tells
		// them of no other address of its own.
		o.LeafNode.NoAdvertise = true
		o.SyncAlways = true
	}})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// Leaf returns the options of cluster's NATS: a leaf node of the hub in
// the JetStream domain cluster, whose connection to the hub runs through
// Link(cluster), carrying none of LeafNodeDeny.
func (h *Hub) Leaf(cluster string) (NATSOptions, error) {
	link, err := NewLink(fmt.Sprintf("127.0.0.1:%d", h.leafPort))
	if err != nil {
		return NATSOptions{}, err
	}
	h.links[cluster] = link
	return NATSOptions{Configure: func(o *natsserver.Options) {
		o.ServerName = cluster
		o.JetStreamDomain = cluster
		o.SyncAlways = true
		o.LeafNode.ReconnectInterval = 250 * time.Millisecond
		o.LeafNode.Remotes = []*natsserver.RemoteLeafOpts{{
			URLs:        []*url.URL{{Scheme: "nats", Host: link.Addr()}},
			DenyImports: LeafNodeDeny,
			DenyExports: LeafNodeDeny,
		}}
	}}, nil
}

// Link carries cluster's leaf node connection to the hub.
func (h *Hub) Link(cluster string) *Link { return h.links[cluster] }

// WaitLinked returns once the NATS at url (a leaf node) answers JetStream
// requests for the hub's domain: its leaf node connection is up.
func WaitLinked(url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := jetStreamReaches(url, HubDomain)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the hub's JetStream not reached from %s in %s: %w", url, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func jetStreamReaches(url, domain string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.NewWithDomain(nc, domain)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

// Stop stops the links and the hub, removing its store.
func (h *Hub) Stop() {
	for _, l := range h.links {
		l.Close()
	}
	h.NATS.Stop()
}
