//go:build !nostack

package natssink_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/sink"
)

// TestGetReadsItsOwnWrites: on a three-node cluster with the bucket at
// three replicas and one follower's network slow (its replica applies each
// write 50 ms after the other two have stored it and the leader has
// acknowledged it), a record written through the leader and read at once
// through that follower is the one written: Get asks the stream leader, not
// the nearest replica (the direct get jetstream.KeyValue.Get sends, which
// the follower may answer from its own, older copy: with it, the record
// was still read after it was deleted). Deleted and missing keys are not
// found.
func TestGetReadsItsOwnWrites(t *testing.T) {
	ctx := context.Background()
	c, err := stack.StartNATSCluster(3, stack.NATSClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	conns := map[string]*nats.Conn{}
	for _, s := range c.Servers {
		nc, err := nats.Connect(s.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		conns[s.Server.Name()] = nc
	}
	cfg := natssink.BucketConfig{Name: "RECORDS", Storage: "file", Replicas: 3}
	if _, err := natssink.EnsureBucket(ctx, conns["n0"], cfg, true); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(conns["n0"])
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, "KV_RECORDS")
	if err != nil {
		t.Fatal(err)
	}
	info := stream.CachedInfo()
	if !info.Config.AllowDirect || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("want a bucket of three replicas that allows direct gets, or the test proves nothing: %+v", info.Config)
	}
	leader, follower := info.Cluster.Leader, info.Cluster.Replicas[0].Name
	writer, err := natssink.EnsureBucket(ctx, conns[leader], cfg, false)
	if err != nil {
		t.Fatal(err)
	}
	reader, err := natssink.EnsureBucket(ctx, conns[follower], cfg, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range c.Links(follower) {
		l.SetDelay(50 * time.Millisecond)
	}
	rev := uint64(0)
	for n := range 20 {
		value := fmt.Sprintf("v%d", n)
		if rev, err = writer.Put(ctx, "k", []byte(value), rev); err != nil {
			t.Fatalf("write %d: %v", n, err)
		}
		got, err := reader.Get(ctx, "k")
		if err != nil {
			t.Fatalf("read after write %d: %v", n, err)
		}
		if got.Revision != rev || string(got.Value) != value {
			t.Fatalf("read through %s after write %d through %s: revision %d %q, written %d %q", follower, n, leader, got.Revision, got.Value, rev, value)
		}
	}
	if _, err := reader.Get(ctx, "never"); !errors.Is(err, sink.ErrNotFound) {
		t.Errorf("missing key: %v, want not found", err)
	}
	if err := writer.Delete(ctx, "k", rev); err != nil {
		t.Fatal(err)
	}
	if _, err := reader.Get(ctx, "k"); !errors.Is(err, sink.ErrNotFound) {
		t.Errorf("deleted key: %v, want not found", err)
	}
}

// TestMoverCountsWritesNotReads: the connection moves once no write
// succeeded for the Mover's time, however many reads succeeded meanwhile:
// a stream leader cut off from its quorum still answers reads until it
// steps down, so an answered read is no sign of a working cluster.
func TestMoverCountsWritesNotReads(t *testing.T) {
	ctx := context.Background()
	_, nc := server(t, nil)
	const after = 300 * time.Millisecond
	mover := natssink.NewMover(nc, after)
	kv, err := natssink.EnsureBucket(ctx, nc, natssink.BucketConfig{Name: "MOVER", Storage: "memory", Replicas: 1, Timeout: time.Second, Mover: mover}, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	failed := fmt.Errorf("%w: put k: no answer", sink.ErrUnavailable)
	if err := mover.Observe(failed); err != failed {
		t.Fatalf("the first failure moved: %v", err)
	}
	// Reads answered all along, and a read's not-found too.
	deadline := time.Now().Add(after + 100*time.Millisecond)
	for time.Now().Before(deadline) {
		if _, err := kv.Get(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Get(ctx, "none"); !errors.Is(err, sink.ErrNotFound) {
			t.Fatalf("get of a key never written: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // reads every 20 ms while no write succeeds for `after`
	}
	err = mover.Observe(failed)
	if !errors.Is(err, sink.ErrUnavailable) || !strings.Contains(err.Error(), "moving to another server") {
		t.Errorf("no write succeeded for %s, reads did: %v, want a move", after+100*time.Millisecond, err)
	}
}

// TestDeleteMarkerRefusesAFirstWrite: a removed record leaves a delete
// marker, and a write that thinks the key never had a record (revision 0:
// a replica paused before its first reservation of a Student that another
// one published, deleted and removed meanwhile) is refused while the
// marker is there (docs/guarantees.md, "one chain"). Once the marker is
// purged the key is new again.
func TestDeleteMarkerRefusesAFirstWrite(t *testing.T) {
	ctx := context.Background()
	_, nc := server(t, nil)
	kv, err := natssink.EnsureBucket(ctx, nc, natssink.BucketConfig{Name: "MARKER", Storage: "memory", Replicas: 1, Timeout: time.Second}, true)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Put(ctx, "k", []byte("first"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("again"), 0); !errors.Is(err, sink.ErrConflict) {
		t.Fatalf("a first write over a record: %v, want a conflict", err)
	}
	if err := kv.Delete(ctx, "k", rev); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("late"), 0); !errors.Is(err, sink.ErrConflict) {
		t.Fatalf("a first write over a delete marker: %v, want a conflict", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := js.KeyValue(ctx, "MARKER")
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.PurgeDeletes(ctx, jetstream.DeleteMarkersOlderThan(-1)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("new"), 0); err != nil {
		t.Errorf("a first write once the marker was purged: %v", err)
	}
}

// TestPutWritesTheKeyFenced: a record written by Put is the bucket's
// value of the key, as nats.go's own client reads it, at the revision Put
// returned; a write over a revision that is not the key's last is a
// conflict, with a Student's uid as the key and with a key nats.go must
// check (one with dots), which Put leaves to nats.go's Update.
func TestPutWritesTheKeyFenced(t *testing.T) {
	ctx := context.Background()
	_, nc := server(t, nil)
	kv, err := natssink.EnsureBucket(ctx, nc, natssink.BucketConfig{Name: "FENCED", Storage: "memory", Replicas: 1, Timeout: time.Second}, true)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := js.KeyValue(ctx, "FENCED")
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"0d1c7a52-51f2-4b7e-9a4e-2f1c0e6b9d3a", "a.b"} {
		first, err := kv.Put(ctx, key, []byte("one"), 0)
		if err != nil {
			t.Fatal(err)
		}
		second, err := kv.Put(ctx, key, []byte("two"), first)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, key, []byte("stale"), first); !errors.Is(err, sink.ErrConflict) {
			t.Errorf("%s: a write over revision %d, not the last (%d): %v, want a conflict", key, first, second, err)
		}
		got, err := raw.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if string(got.Value()) != "two" || got.Revision() != second {
			t.Errorf("%s: the bucket holds %q at revision %d, want %q at %d", key, got.Value(), got.Revision(), "two", second)
		}
	}
	if _, err := kv.Put(ctx, "no key", []byte("x"), 0); err == nil {
		t.Error("a key no subject can hold was written")
	}
}
