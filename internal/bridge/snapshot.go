package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/reconciler"
)

// snapshotServer publishes snapshots at startup and on request. It runs on
// the leader only, so one replica answers.
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
	log        logr.Logger
	runs       atomic.Int64
}

func (s *snapshotServer) NeedLeaderElection() bool { return true }

func (s *snapshotServer) Start(ctx context.Context) error {
	if !s.cache.WaitForCacheSync(ctx) {
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
		s.log.Info("answering snapshot requests", "subject", subject)
	}
	if s.onStartup {
		s.startup(ctx)
	}
	<-ctx.Done()
	return nil
}

// startup retries the startup snapshot until it is complete: NATS may not
// be reachable yet.
func (s *snapshotServer) startup(ctx context.Context) {
	run := s.newRun("startup")
	_ = retry(ctx, s.log.WithValues("run", run), "startup snapshot", func(ctx context.Context) error {
		n, err := s.snap.Snapshot(ctx, "", run)
		if err == nil {
			s.log.Info("startup snapshot published", "run", run, "students", n)
		}
		return err
	})
}

func (s *snapshotServer) serve(ctx context.Context, msg *nats.Msg) {
	var req studentv1.SnapshotRequest
	reply := studentv1.SnapshotReply{Run: s.newRun("request"), Cluster: s.snap.Cluster}
	if len(msg.Data) > 0 {
		if err := json.Unmarshal(msg.Data, &req); err != nil {
			reply.Error = fmt.Sprintf("bad request: %v", err)
		}
	}
	if reply.Error == "" && req.Namespace != "" && len(s.namespaces) > 0 && !slices.Contains(s.namespaces, req.Namespace) {
		reply.Error = fmt.Sprintf("namespace %q is not watched by this bridge (namespaces: %v)", req.Namespace, s.namespaces)
	}
	if reply.Error == "" {
		n, err := s.snap.Snapshot(ctx, req.Namespace, reply.Run)
		reply.Published = n
		if err != nil {
			reply.Error = err.Error()
		}
		s.log.Info("snapshot on request", "run", reply.Run, "namespace", req.Namespace, "students", n, "error", reply.Error)
	}
	b, _ := json.Marshal(reply)
	if msg.Reply != "" {
		_ = msg.Respond(b)
	}
}

func (s *snapshotServer) newRun(kind string) string {
	return kind + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatInt(s.runs.Add(1), 10)
}
