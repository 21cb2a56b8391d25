package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	httppprof "net/http/pprof"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stages"
)

// Variants as processes of their own, as they run in a cluster: the
// bridge's binary (one, or three replicas over 16 shards) and the raw
// informer (this benchmark's binary, started as "raw-informer"). Their CPU
// is counted apart from this process's (generator, NATS, subscriber), and
// the bridge's API writes and stage latencies come from its own /metrics.

// binaries are what the process variants and the memory phase run, built
// once per benchmark run.
type binaries struct {
	once                       sync.Once
	err                        error
	dir, bridge, bench, config string
}

// prepare builds the bridge and this benchmark into a temporary folder and
// writes a kubeconfig for the stack's API server.
func (e *env) prepare() (*binaries, error) {
	b := e.bins
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", "student-bridge-bench-"); b.err != nil {
			return
		}
		b.bridge, b.bench, b.config = filepath.Join(b.dir, "student-bridge"), filepath.Join(b.dir, "bench"), filepath.Join(b.dir, "kubeconfig")
		for out, pkg := range map[string]string{b.bridge: "./cmd/student-bridge", b.bench: "./test/bench"} {
			if b.err = stack.Build(out, pkg); b.err != nil {
				return
			}
		}
		user, err := e.st.Env.AddUser(envtest.User{Name: "bench", Groups: []string{"system:masters"}}, nil)
		if err != nil {
			b.err = err
			return
		}
		kc, err := user.KubeConfig()
		if err != nil {
			b.err = err
			return
		}
		b.err = os.WriteFile(b.config, kc, 0o600)
	})
	return b, b.err
}

func (b *binaries) cleanup() {
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}

// proc is one process of a variant; metrics is its /metrics URL (none for
// the raw informer).
type proc struct {
	*child
	metrics string
	pprof   string // with BENCH_PROFILE_DIR: its pprof address
}

// startProcesses starts n bridge processes for the run (n > 1: over 16
// shards), with the flags extra, and the subscriber.
func startProcesses(ctx context.Context, e *env, r *run, n int, extra ...string) (func(), error) {
	b, err := e.prepare()
	if err != nil {
		return nil, err
	}
	args := processArgs(b, e, r, n, extra...)
	stop := func() { stopProcs(r.procs) }
	for range n {
		p, err := startProcess(b, args)
		if err != nil {
			stop()
			return nil, err
		}
		r.procs = append(r.procs, p)
	}
	if n > 1 {
		if err := settled(ctx, e, r, n, 16, 60*time.Second); err != nil {
			stop()
			return nil, err
		}
	}
	return withSubscriber(ctx, e, r, stop)
}

// processArgs are the flags of the run's bridge processes, n of them,
// with extra.
func processArgs(b *binaries, e *env, r *run, n int, extra ...string) []string {
	args := []string{"--kubeconfig", b.config, "--nats-url", e.url, "--cluster", "bench", "--namespaces", r.ns,
		"--stream-name", r.stream, "--records-bucket", r.stream + "_RECORDS", "--receipts-bucket", r.stream + "_RECEIPTS",
		"--subject-prefix", r.prefix, "--snapshot-request-subject", "",
		"--stream-replicas", strconv.Itoa(e.replicas), "--records-replicas", strconv.Itoa(e.replicas)}
	args = append(args, extra...)
	if n > 1 {
		// The shipped Lease timing: a replica's renewals and its reads of
		// the Leases are part of what it costs.
		return append(args, "--shards", "16", "--leader-election-id", "bench-"+r.id, "--leader-election-namespace", r.ns)
	}
	return append(args, "--leader-elect=false")
}

// processEnv is the environment of the bridge and informer processes
// the benchmark starts: this one's, with GOMAXPROCS set to
// BENCH_GOMAXPROCS if that is set.
func processEnv() []string {
	env := os.Environ()
	if v := os.Getenv("BENCH_GOMAXPROCS"); v != "" {
		env = append(env, "GOMAXPROCS="+v)
	}
	return env
}

// startProcess starts a bridge process with args and waits until it is
// ready. A start that lost one of its ports to another process before it
// listened on it is tried again on new ones.
func startProcess(b *binaries, args []string) (*proc, error) {
	for attempt := 1; ; attempt++ {
		p, err := startProcessOnce(b, args)
		switch {
		case err == nil:
			return p, nil
		case attempt == 3 || p == nil || !p.portTaken():
			return nil, err
		}
	}
}

// profiledAddr is, with BENCH_PROFILE_DIR, a free address for a
// process's pprof endpoint, and empty without: then nothing is profiled.
func profiledAddr() string {
	if os.Getenv("BENCH_PROFILE_DIR") == "" {
		return ""
	}
	return freeAddr()
}

func startProcessOnce(b *binaries, args []string) (*proc, error) {
	metricsAddr, healthAddr, pprofAddr := freeAddr(), freeAddr(), profiledAddr()
	args = append(slices.Clone(args), "--metrics-bind-address", metricsAddr, "--health-probe-bind-address", healthAddr)
	if pprofAddr != "" {
		args = append(args, "--pprof-bind-address", pprofAddr)
	}
	cmd := exec.Command(b.bridge, args...)
	cmd.Env = processEnv()
	c, err := startChild(cmd)
	if err != nil {
		return nil, err
	}
	p := &proc{child: c, metrics: "http://" + metricsAddr + "/metrics", pprof: pprofAddr}
	if err := c.waitHTTP("http://"+healthAddr+"/readyz", 60*time.Second); err != nil {
		stopProcs([]*proc{p})
		return p, err
	}
	return p, nil
}

// startRawInformerProcess runs the raw informer as a process of its own.
func startRawInformerProcess(ctx context.Context, e *env, r *run) (func(), error) {
	return rawInformerProcess(ctx, e, r, false)
}

// startAckedInformerProcess runs the raw informer as a process of its own,
// each handler waiting for its event's ack.
func startAckedInformerProcess(ctx context.Context, e *env, r *run) (func(), error) {
	return rawInformerProcess(ctx, e, r, true)
}

// startUncompressedInformerProcess is startAckedInformerProcess with
// compression turned off, as the bridge has it by default.
func startUncompressedInformerProcess(ctx context.Context, e *env, r *run) (func(), error) {
	return rawInformerProcess(ctx, e, r, true, "-compression=false")
}

func rawInformerProcess(ctx context.Context, e *env, r *run, acked bool, extra ...string) (func(), error) {
	b, err := e.prepare()
	if err != nil {
		return nil, err
	}
	if err := ensureStream(ctx, e, r); err != nil {
		return nil, err
	}
	args := append([]string{"raw-informer", "-kubeconfig", b.config, "-nats", e.url, "-namespace", r.ns, "-prefix", r.prefix, "-acked=" + strconv.FormatBool(acked)}, extra...)
	pprofAddr := profiledAddr() // profiled as the bridge is
	if pprofAddr != "" {
		args = append(args, "-pprof", pprofAddr)
	}
	cmd := exec.Command(b.bench, args...)
	cmd.Env = processEnv()
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	c, err := startChild(cmd)
	if err != nil {
		return nil, err
	}
	r.procs = []*proc{{child: c, pprof: pprofAddr}}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "ready" {
			err = fmt.Errorf("raw informer said %q", line)
		}
		ready <- err
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case err = <-ready:
	case <-time.After(60 * time.Second):
		err = fmt.Errorf("raw informer not ready within 60s")
	}
	if err != nil {
		stopProcs(r.procs)
		return nil, err
	}
	return withSubscriber(ctx, e, r, func() { stopProcs(r.procs) })
}

// rawInformerMain is this binary started as "raw-informer": the raw
// informer until SIGTERM. It prints "ready" once its cache synced.
func rawInformerMain(args []string) int {
	fs := flag.NewFlagSet("raw-informer", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the API server")
	url := fs.String("nats", "", "NATS URL")
	ns := fs.String("namespace", "", "namespace of the Students")
	prefix := fs.String("prefix", "", "subject prefix")
	acked := fs.Bool("acked", false, "wait for each event's ack before the next")
	compression := fs.Bool("compression", true, "ask for gzip-compressed responses (client-go's default)")
	pprofAddr := fs.String("pprof", "", "if set, serve /debug/pprof/ on this address (as the bridge's pprofAddr)")
	_ = fs.Parse(args)
	restCfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "raw-informer:", err)
		return 1
	}
	restCfg.DisableCompression = !*compression
	if *pprofAddr != "" {
		l, err := net.Listen("tcp", *pprofAddr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "raw-informer:", err)
			return 1
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", httppprof.Index)
		mux.HandleFunc("/debug/pprof/profile", httppprof.Profile)
		go func() { _ = http.Serve(l, mux) }() //nolint:gosec // a benchmark's loopback endpoint
	}
	nc, err := nats.Connect(*url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "raw-informer:", err)
		return 1
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		fmt.Fprintln(os.Stderr, "raw-informer:", err)
		return 1
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	stop, err := runRawInformer(ctx, restCfg, js, *ns, *prefix, *acked)
	if err != nil {
		fmt.Fprintln(os.Stderr, "raw-informer:", err)
		return 1
	}
	defer stop()
	fmt.Println("ready")
	<-ctx.Done()
	return 0
}

// informerSyncMain is this binary started as "informer-sync": a raw
// informer started as a process of its own, as a controller restarts
// (a new process, its API discovery, a heap that grows from nothing). It
// lists and watches the Students of a namespace, prints "synced" once its
// cache synced, and exits: the reference for a restart of the bridge.
func informerSyncMain(args []string) int {
	fs := flag.NewFlagSet("informer-sync", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the API server")
	ns := fs.String("namespace", "", "namespace of the Students")
	since := fs.Int64("changes-since", 0, "If set (Unix ns), also say when the cache synced (\"synced <Unix ns>\"), then, a second later, when it first saw "+
		"each change made since (a Student whose school is t<Unix ns of the change>): \"<change> <seen>\", one per line")
	_ = fs.Parse(args)
	restCfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "informer-sync:", err)
		return 1
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	// The raw informer variant's cache, without its handler: nothing is
	// published.
	c, inf, err := rawInformerCache(ctx, restCfg, *ns)
	if err != nil {
		fmt.Fprintln(os.Stderr, "informer-sync:", err)
		return 1
	}
	var seen changesSeen
	if *since != 0 {
		if _, err := inf.AddEventHandler(seen.handler(*since)); err != nil {
			fmt.Fprintln(os.Stderr, "informer-sync:", err)
			return 1
		}
	}
	go func() { _ = c.Start(ctx) }()
	if !informerSynced(ctx, inf) {
		fmt.Fprintln(os.Stderr, "informer-sync: the cache did not sync")
		return 1
	}
	if *since == 0 {
		fmt.Println("synced")
		return 0
	}
	fmt.Println("synced", time.Now().UnixNano())
	time.Sleep(time.Second) // the changes made while it listed, by watch
	for change, at := range seen.all() {
		fmt.Println(change, at)
	}
	return 0
}

// changesSeen is when an informer first saw each change the benchmark's
// load made (a Student whose school is t<Unix ns of the change>).
type changesSeen struct {
	mu   sync.Mutex
	seen map[int64]int64 // change's Unix ns: first seen, Unix ns
}

// handler notes the changes made since (Unix ns).
func (c *changesSeen) handler(since int64) toolscache.ResourceEventHandler {
	note := func(obj any) {
		now := time.Now().UnixNano()
		s, ok := obj.(*studentv1.Student)
		if !ok {
			return
		}
		change, ok := changeMadeAt(s.Spec.School)
		if !ok || change < since {
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.seen == nil {
			c.seen = map[int64]int64{}
		}
		if _, ok := c.seen[change]; !ok {
			c.seen[change] = now
		}
	}
	return toolscache.ResourceEventHandlerFuncs{AddFunc: note, UpdateFunc: func(_, obj any) { note(obj) }}
}

func (c *changesSeen) all() map[int64]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.seen)
}

func stopProcs(ps []*proc) {
	for _, p := range ps {
		p.terminate()
	}
	for _, p := range ps {
		p.stop()
	}
}

// usage is what a run's processes have used so far: CPU seconds, and from
// the bridges' /metrics their API writes, Kubernetes Events and stages.
type usage struct {
	cpu            float64
	writes, events float64
	// natsSent and natsReceived are the messages the bridges sent to
	// NATS and received from it.
	natsSent, natsReceived float64
	stages                 map[string]stages.Histogram
}

func (r *run) usage() (usage, error) {
	var u usage
	var all []map[string]stages.Histogram
	for _, p := range r.procs {
		u.cpu += processCPU(p.cmd.Process.Pid)
		if p.metrics == "" {
			continue
		}
		families, err := stages.Gather(p.metrics)
		if err != nil {
			return u, err
		}
		// Its client-go requests other than GETs are its writes to the
		// API server (Students, Events, Leases).
		u.writes += counterSum(families, "rest_client_requests_total", func(l map[string]string) bool { return l["method"] != "GET" })
		u.events += counterSum(families, "student_bridge_kubernetes_events_total", func(l map[string]string) bool { return l["result"] == "written" })
		u.natsSent += counterSum(families, "student_bridge_nats_messages_sent_total", func(map[string]string) bool { return true })
		u.natsReceived += counterSum(families, "student_bridge_nats_messages_received_total", func(map[string]string) bool { return true })
		all = append(all, stages.FromFamilies(families))
	}
	u.stages = stages.Sum(all...)
	return u, nil
}

// counterSum adds up the counters of name among families whose labels
// match.
func counterSum(families []*dto.MetricFamily, name string, match func(labels map[string]string) bool) float64 {
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if match(labelMap(m)) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
