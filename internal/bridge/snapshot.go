package bridge

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/reconciler"
)

// How a snapshot request was answered, the "result" label of
// student_bridge_snapshot_requests_total.
const (
	snapshotNewRun    = "new_run"
	snapshotCoalesced = "coalesced"
	snapshotRefused   = "refused"
)

var snapshotRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "student_bridge_snapshot_requests_total",
	Help: "Snapshot requests by how they were answered: new_run (a snapshot was published for it), coalesced (a run in flight, " +
		"or one that ended within snapshot.minInterval whose events the stream holds, answered it), refused (a bad request, " +
		"a namespace not watched, or a run that failed).",
}, []string{"result"})

// snapshotServer publishes snapshots at startup and on request. It runs on
// the leader only, so one replica answers (with shards, each replica
// answers the requests its queue group member gets).
//
// A snapshot publishes every Student into a stream that may keep it for
// weeks, so requests are coalesced per scope (a namespace, or all): a
// request while a run covering it is in flight waits for that run, and
// one within minInterval of a run that ended, whose events the stream
// still holds, is answered by it. A service in a crash loop, or ten
// services started together, add one snapshot per interval, not one each.
type snapshotServer struct {
	nc        *nats.Conn
	cache     cache.Cache
	snap      *reconciler.Snapshotter
	onStartup bool
	// subjects are where requests are answered: snapshot.requestSubject
	// and, in a fleet, <snapshot.requestSubject>.<cluster>.
	subjects []string
	// namespaces are the watched namespaces; empty means all.
	namespaces []string
	// stream is the bridge's stream (empty on core NATS: nothing is
	// stored, so only runs in flight are shared).
	stream      string
	minInterval time.Duration
	log         logr.Logger
	runs        atomic.Int64

	mu       sync.Mutex
	inFlight map[string]*snapshotRun // by namespace ("": all)
	last     map[string]*snapshotRun // the last complete run, by namespace
}

// snapshotRun is one snapshot of a namespace ("": all), in flight until
// done is closed.
type snapshotRun struct {
	id        string
	namespace string
	done      chan struct{}
	result    reconciler.SnapshotResult
	err       error
	ended     time.Time
}

func (s *snapshotServer) NeedLeaderElection() bool { return true }

func (s *snapshotServer) Start(ctx context.Context) error {
	if !reconciler.WaitForStudents(ctx, s.cache) {
		return nil
	}
	for _, subject := range s.subjects {
		// A queue group: with active-active replicas (shards), one of them
		// answers each request.
		sub, err := s.nc.QueueSubscribe(subject, "student-bridge", func(msg *nats.Msg) { go s.serve(ctx, msg) })
		if err != nil {
			return fmt.Errorf("subscribe to snapshot requests on %s: %w", subject, err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		s.log.Info("answering snapshot requests", "subject", subject, "minInterval", s.minInterval.String())
	}
	if s.onStartup {
		s.startup(ctx)
	}
	<-ctx.Done()
	return nil
}

// startup retries the startup snapshot until it is complete (NATS may not
// be reachable yet); requests meanwhile wait for it.
func (s *snapshotServer) startup(ctx context.Context) {
	_ = retry(ctx, s.log, "startup snapshot", func(ctx context.Context) error {
		run, _, err := s.answer(ctx, "", "startup", true)
		if err == nil && run.err == nil {
			s.log.Info("startup snapshot published", "run", run.id, "students", run.result.Published)
		}
		return cmp.Or(err, run.err)
	})
}

// answer returns the run that answers a request for namespace, made now
// (isNew) or shared (see join), once it ended; err is set only when ctx
// ended first.
func (s *snapshotServer) answer(ctx context.Context, namespace, kind string, reuseEnded bool) (run *snapshotRun, isNew bool, err error) {
	run, isNew = s.join(ctx, namespace, kind, reuseEnded)
	if isNew {
		run.result, run.err = s.snap.Snapshot(ctx, namespace, run.id)
		s.finish(run)
		return run, true, nil
	}
	select {
	case <-run.done:
		return run, false, nil
	case <-ctx.Done():
		return run, false, ctx.Err()
	}
}

func (s *snapshotServer) serve(ctx context.Context, msg *nats.Msg) {
	reply := studentv1.SnapshotReply{Cluster: s.snap.Cluster}
	req, err := studentv1.ParseSnapshotRequest(msg.Data)
	if err != nil {
		reply.Error = err.Error()
	}
	if reply.Error == "" && req.Namespace != "" && len(s.namespaces) > 0 && !slices.Contains(s.namespaces, req.Namespace) {
		reply.Error = fmt.Sprintf("namespace %q is not watched by this bridge (namespaces: %v)", req.Namespace, s.namespaces)
	}
	result := snapshotRefused
	if reply.Error != "" {
		s.log.Info("refused a snapshot request", "subject", msg.Subject, "reason", reply.Error)
	} else {
		// A request from a fleet's hub (on <subject>.<cluster>) reads the
		// hub's stream, whose contents this bridge cannot see: only a run
		// in flight answers it.
		run, isNew, err := s.answer(ctx, req.Namespace, "request", msg.Subject == s.subjects[0])
		if err != nil {
			return // shutting down: no answer, the requester asks again
		}
		reply.Run, reply.Published, reply.FirstSequence, reply.Coalesced = run.id, run.result.Published, run.result.FirstSequence, !isNew
		reply.Ended = run.ended.UTC().Format(time.RFC3339Nano)
		if s.stream != "" && s.minInterval > 0 {
			reply.NextRun = run.ended.Add(s.minInterval).UTC().Format(time.RFC3339Nano)
		}
		switch {
		case run.err != nil:
			reply.Error = run.err.Error()
		case isNew:
			result = snapshotNewRun
		default:
			result = snapshotCoalesced
		}
		s.log.Info("snapshot on request", "run", run.id, "namespace", req.Namespace, "coalesced", !isNew, "students", run.result.Published, "error", reply.Error)
	}
	snapshotRequests.WithLabelValues(result).Inc()
	b, _ := json.Marshal(reply)
	if msg.Reply != "" {
		_ = msg.Respond(b)
	}
}

// join returns the run that answers a request for namespace: one in
// flight that covers it, else (with reuseEnded) one that ended within
// minInterval and whose events the stream still holds, else a new run
// (isNew) that the caller makes and finishes.
func (s *snapshotServer) join(ctx context.Context, namespace, kind string, reuseEnded bool) (run *snapshotRun, isNew bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight == nil {
		s.inFlight, s.last = map[string]*snapshotRun{}, map[string]*snapshotRun{}
	}
	for _, scope := range []string{namespace, ""} {
		if r := s.inFlight[scope]; r != nil {
			return r, false
		}
	}
	for _, scope := range []string{namespace, ""} {
		if r := s.last[scope]; reuseEnded && r != nil && time.Since(r.ended) < s.minInterval && s.stillHeld(ctx, r) {
			return r, false
		}
	}
	r := &snapshotRun{id: s.newRun(kind), namespace: namespace, done: make(chan struct{})}
	s.inFlight[namespace] = r
	return r, true
}

// stillHeld reports whether the stream still holds r's first event: then
// a reader from there sees the whole run. On core NATS nothing is held.
func (s *snapshotServer) stillHeld(ctx context.Context, r *snapshotRun) bool {
	switch {
	case s.stream == "":
		return false // core NATS: nothing is stored
	case r.result.Published == 0:
		return true // nothing to read
	}
	js, err := jetstream.New(s.nc)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, s.stream)
	if err != nil {
		return false
	}
	return stream.CachedInfo().State.FirstSeq <= r.result.FirstSequence
}

// finish ends run: it answers the requests waiting for it, and, if it
// succeeded, those of the next minInterval.
func (s *snapshotServer) finish(run *snapshotRun) {
	s.mu.Lock()
	defer s.mu.Unlock()
	run.ended = time.Now()
	delete(s.inFlight, run.namespace)
	if run.err == nil {
		s.last[run.namespace] = run
	}
	close(run.done)
}

func (s *snapshotServer) newRun(kind string) string {
	return kind + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatInt(s.runs.Add(1), 10)
}
