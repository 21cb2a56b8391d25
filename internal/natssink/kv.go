package natssink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/student-bridge/student-bridge/sink"
)

// BucketConfig is what the bridge asks of its record store bucket.
type BucketConfig struct {
	// Name of the key-value bucket, e.g. STUDENT_BRIDGE_PUBLISHED.
	Name string
	// Storage is "file" or "memory".
	Storage string
	// Replicas is the number of replicas (1 for a single server).
	Replicas int
	// Description of a created bucket; default: the record store's.
	Description string
	// Timeout bounds one read or write when the caller's context has no
	// earlier deadline. Default 5s.
	Timeout time.Duration
	// Mover, if set, is told how each read and write went.
	Mover *Mover
	// Source, if set, is a stream the bucket sources (a fleet's hub
	// receipts for this cluster): set on a created bucket, and added to an
	// existing bucket that lacks it.
	Source *jetstream.StreamSource
	// Domain, if set, is the JetStream domain the bucket is in, when it is
	// not the connection's own (a cluster's, read from a fleet's hub).
	Domain string
}

// ErrBucketShape means the bucket exists but cannot serve as the record store
// (its keys expire). The bridge never changes an existing bucket.
var ErrBucketShape = errors.New("natssink: bucket cannot hold the records")

// KV is a sink.Store on a JetStream key-value bucket. Every write is a
// compare-and-set on the key's revision.
type KV struct {
	nc       *nats.Conn
	requests *requests
	kv       jetstream.KeyValue
	bucket   string
	timeout  time.Duration
	mover    *Mover
	// put is the subject prefix a write of a key goes to ($KV.<bucket>.),
	// written by publishJS; "" for a bucket in another domain or a
	// mirror, written by nats.go's Update.
	put    string
	stream string // the bucket's stream, which answers a write
}

var _ sink.Store = (*KV)(nil)

// EnsureBucket returns the record store on bucket cfg.Name, creating the
// bucket first (one revision per key, no expiry) if it is missing and create
// is true. An existing bucket is never changed; one whose keys expire is
// refused with an error wrapping ErrBucketShape.
func EnsureBucket(ctx context.Context, nc *nats.Conn, cfg BucketConfig, create bool) (*KV, error) {
	js, err := jetstream.New(nc)
	if cfg.Domain != "" {
		js, err = jetstream.NewWithDomain(nc, cfg.Domain)
	}
	if err != nil {
		return nil, fmt.Errorf("natssink: jetstream: %w", err)
	}
	kv, err := js.KeyValue(ctx, cfg.Name)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound) && create:
		storage, serr := Storage(cfg.Storage)
		if serr != nil {
			return nil, fmt.Errorf("bucket %s %w", cfg.Name, serr)
		}
		if cfg.Description == "" {
			cfg.Description = "What student-bridge published per Student uid"
		}
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      cfg.Name,
			Description: cfg.Description,
			History:     1,
			Storage:     storage,
			Replicas:    cfg.Replicas,
			Sources:     sources(cfg.Source),
		})
		if err != nil {
			return nil, fmt.Errorf("create bucket %s: %w", cfg.Name, err)
		}
	case err != nil:
		return nil, fmt.Errorf("look up bucket %s: %w", cfg.Name, err)
	case cfg.Source != nil:
		if err := addSource(ctx, js, "KV_"+cfg.Name, cfg.Source); err != nil {
			return nil, fmt.Errorf("bucket %s: %w", cfg.Name, err)
		}
	}
	status, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("bucket %s status: %w", cfg.Name, err)
	}
	if status.TTL() > 0 {
		return nil, fmt.Errorf("%w: bucket %s expires keys after %s, and an expired record would be published again; use a bucket without TTL",
			ErrBucketShape, cfg.Name, status.TTL())
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	s := &KV{nc: nc, requests: newRequests(nc), kv: kv, bucket: cfg.Name, timeout: cfg.Timeout, mover: cfg.Mover}
	if st, ok := status.(*jetstream.KeyValueBucketStatus); ok && cfg.Domain == "" && st.StreamInfo().Config.Mirror == nil {
		s.put, s.stream = "$KV."+cfg.Name+".", "KV_"+cfg.Name
	}
	return s, nil
}

func sources(s *jetstream.StreamSource) []*jetstream.StreamSource {
	if s == nil {
		return nil
	}
	return []*jetstream.StreamSource{s}
}

// addSource adds src to stream's sources unless it has one of the same
// stream, domain and filter.
func addSource(ctx context.Context, js jetstream.JetStream, stream string, src *jetstream.StreamSource) error {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("look up stream %s: %w", stream, err)
	}
	cfg := st.CachedInfo().Config
	if HasSource(cfg.Sources, src) {
		return nil
	}
	cfg.Sources = append(cfg.Sources, src)
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("add source %s to stream %s: %w", src.Name, stream, err)
	}
	return nil
}

// HasSource reports whether sources has one of the same stream of the
// same domain as src, with the same filter and subject transforms.
func HasSource(sources []*jetstream.StreamSource, src *jetstream.StreamSource) bool {
	api := func(s *jetstream.StreamSource) string {
		if s.External == nil {
			return ""
		}
		return s.External.APIPrefix
	}
	return slices.ContainsFunc(sources, func(s *jetstream.StreamSource) bool {
		return s.Name == src.Name && api(s) == api(src) && s.FilterSubject == src.FilterSubject &&
			slices.Equal(s.SubjectTransforms, src.SubjectTransforms)
	})
}

// PurgeDeleteMarkers removes the delete markers older than olderThan
// that removed records leave behind, so they do not pile up in the bucket.
// While a marker is there, a writer that still thinks the key has no
// record (a replica paused before its first reservation of a Student that
// another replica then published, deleted and removed) is refused.
func (s *KV) PurgeDeleteMarkers(ctx context.Context, olderThan time.Duration) error {
	count(requestPurge)
	if err := s.kv.PurgeDeletes(ctx, jetstream.DeleteMarkersOlderThan(olderThan)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return s.classify("purge delete markers", err)
	}
	return nil
}

// Load implements sink.Store with one watch of every key.
func (s *KV) Load(ctx context.Context) ([]sink.Record, error) {
	count(requestLoad)
	w, err := s.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, s.classify("watch", err)
	}
	defer func() { _ = w.Stop() }()
	var out []sink.Record
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, s.classify("watch", sink.ErrClosed)
			}
			if e == nil { // every current key has been delivered
				return out, nil
			}
			out = append(out, sink.Record{Key: e.Key(), Value: e.Value(), Revision: e.Revision()})
		}
	}
}

// Watch calls apply with every key of the bucket, then synced once, then
// apply with every change (deleted for a removed key) until ctx is done.
// It returns nil when ctx is done, an error when the watch ends otherwise.
func (s *KV) Watch(ctx context.Context, apply func(rec sink.Record, deleted bool), synced func()) error {
	count(requestWatch)
	w, err := s.kv.WatchAll(ctx)
	if err != nil {
		return s.classify("watch", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return s.classify("watch", sink.ErrClosed)
			}
			if e == nil {
				synced()
				continue
			}
			deleted := e.Operation() != jetstream.KeyValuePut
			apply(sink.Record{Key: e.Key(), Value: e.Value(), Revision: e.Revision()}, deleted)
		}
	}
}

// Get implements sink.Store. It asks the bucket's stream leader: a
// direct get (what jetstream.KeyValue.Get sends when the bucket allows it,
// as buckets do by default) may be answered by any replica, also one that
// has not applied the latest write yet. The bridge reads a key after a
// compare-and-set conflict, so it must see the write that won, not an
// older one that makes its next write conflict again.
func (s *KV) Get(ctx context.Context, key string) (sink.Record, error) {
	rec, err := s.get(ctx, key)
	if err != nil && !errors.Is(err, sink.ErrNotFound) {
		return rec, s.mover.Observe(err)
	}
	// An answer is no sign of a working cluster: a leader cut off from
	// its quorum still answers reads until it steps down.
	return rec, err
}

func (s *KV) get(ctx context.Context, key string) (sink.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	count(requestRead)
	seq, h, data, err := lastMsg(ctx, s.nc, "KV_"+s.bucket, "$KV."+s.bucket+"."+key)
	switch {
	case errors.Is(err, errNoMessage):
		return sink.Record{}, s.classify("get "+key, jetstream.ErrKeyNotFound)
	case err != nil:
		return sink.Record{}, s.classify("get "+key, err)
	}
	// A delete or purge marker, or a marker the server leaves when a key's
	// time to live ends: the key has no value.
	if h.Get("KV-Operation") != "" || h.Get(jetstream.MarkerReasonHeader) != "" {
		return sink.Record{}, s.classify("get "+key, jetstream.ErrKeyDeleted)
	}
	return sink.Record{Key: key, Value: data, Revision: seq}, nil
}

// errNoMessage: the subject holds no message.
var errNoMessage = errors.New("no message")

// lastMsg reads the last message of subject from stream's leader (not a
// direct get, which any replica may answer, also one that has not applied
// the latest write yet). A subject without messages is errNoMessage.
func lastMsg(ctx context.Context, nc *nats.Conn, stream, subject string) (uint64, nats.Header, []byte, error) {
	req, err := json.Marshal(map[string]string{"last_by_subj": subject})
	if err != nil {
		return 0, nil, nil, err
	}
	reply, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return 0, nil, nil, err
	}
	var resp struct {
		Message *struct {
			Sequence uint64 `json:"seq"`
			Header   []byte `json:"hdrs"`
			Data     []byte `json:"data"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return 0, nil, nil, fmt.Errorf("bad reply: %w", err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return 0, nil, nil, errNoMessage
	case resp.Error != nil:
		return 0, nil, nil, resp.Error
	case resp.Message == nil:
		return 0, nil, nil, errors.New("reply without a message")
	}
	h := nats.Header{}
	if len(resp.Message.Header) > 0 {
		if h, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
			return 0, nil, nil, fmt.Errorf("bad headers: %w", err)
		}
	}
	return resp.Message.Sequence, h, resp.Message.Data, nil
}

// Put implements sink.Store: a write if the key is at revision (0: it has
// no value and no delete marker), else sink.ErrConflict.
func (s *KV) Put(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	count(requestWrite)
	// Revision 0 means the key has never had a value, or its delete
	// marker is gone (PurgeDeleteMarkers): kv.Create would also write over
	// a marker, and so let a replica that lost the Student (paused before
	// its first reservation) bring back a record another one removed.
	rev, err := s.update(ctx, key, value, revision)
	if err != nil {
		return 0, s.mover.Observe(s.classify("put "+key, err))
	}
	_ = s.mover.Observe(nil)
	return rev, nil
}

// update is the bucket's Update, as nats.go writes it (a message on the
// key's subject, fenced by the subject's last sequence), with the answer
// read by publishJS, within the store's timeout.
func (s *KV) update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	if s.put == "" || !plainKey(key) {
		ctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		return s.kv.Update(ctx, key, value, revision) // which refuses a key no subject can hold
	}
	m := nats.NewMsg(s.put + key)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(revision, 10))
	m.Data = value
	a, err := s.requests.publishJS(ctx, m, s.stream, s.timeout)
	return a.Seq, err
}

// plainKey reports whether key is one of letters, digits and "-_=/"
// (a Student's uid is), which is a key nats.go takes and a subject token
// as it is.
func plainKey(key string) bool {
	plain := func(c byte) bool {
		return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '=' || c == '/'
	}
	for _, c := range []byte(key) {
		if !plain(c) {
			return false
		}
	}
	return key != ""
}

// Delete implements sink.Store.
func (s *KV) Delete(ctx context.Context, key string, revision uint64) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	count(requestDelete)
	if err := s.kv.Delete(ctx, key, jetstream.LastRevision(revision)); err != nil {
		return s.mover.Observe(s.classify("delete "+key, err))
	}
	_ = s.mover.Observe(nil)
	return nil
}

// classify wraps err with the sink sentinel that says what the caller can do.
func (s *KV) classify(op string, err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return fmt.Errorf("%w: %s: %w", sink.ErrNotFound, op, err)
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch),
		errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant):
		return fmt.Errorf("%w: %s: %w", sink.ErrConflict, op, err)
	case errors.Is(err, nats.ErrMaxPayload):
		return fmt.Errorf("%w: %s: %w", sink.ErrTooLarge, op, err)
	case isUnavailable(err):
		return fmt.Errorf("%w: %s: %w", sink.ErrUnavailable, op, err)
	case errors.As(err, &apiErr):
		return fmt.Errorf("%w: %s: %w", sink.ErrRejected, op, err)
	case errors.Is(err, nats.ErrConnectionClosed):
		return fmt.Errorf("%w: %s: %w", sink.ErrClosed, op, err)
	case !s.nc.IsConnected(), disconnected(err):
		return fmt.Errorf("%w: %s: %w", sink.ErrNotConnected, op, err)
	case noAnswer(err):
		// The bucket's stream exists (it was made or found at the start):
		// its leader is out of reach.
		return fmt.Errorf("%w: %s: the bucket's stream did not answer (its leader is out of reach: an election, or no quorum): %w", sink.ErrUnavailable, op, err)
	}
	return fmt.Errorf("record store: %s: %w", op, err)
}
