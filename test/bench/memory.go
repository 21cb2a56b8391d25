package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// deployedMemoryLimit is the container memory limit of the shipped
// Deployment and chart; the bridge in a container sets its Go memory limit
// to 90% of it, as the process here is told by GOMEMLIMIT.
const deployedMemoryLimit = "256Mi"

// goMemLimit is the GOMEMLIMIT variable the bridge sets for itself in a
// container limited to deployedMemoryLimit.
func goMemLimit() string {
	limit := resource.MustParse(deployedMemoryLimit)
	return fmt.Sprintf("GOMEMLIMIT=%d", limit.Value()/10*9)
}

// restartReps is how many restarts with every Student published, and
// starts of the raw informer's process, the restart table compares.
const restartReps = 3

// settleWindow: steady memory is sampled once RSS moved less than 1% in
// it, after a garbage collection, or at the phase's bound (-memory-settle).
const settleWindow = 10 * time.Second

// memoryAndRestart runs the real binary as its own process, so its RSS and
// Go heap are its own: at rest, with each count of published Students
// (without a memory limit, and with the deployments' memoryLimit), the
// time a restart takes to catch up with them against a raw informer's
// sync, the same restart under a stream of live changes, and what the
// restarts republished.
func memoryAndRestart(ctx context.Context, e *env, counts []int, settleBound time.Duration) (Scale, error) {
	out := Scale{SettleWindow: settleWindow.String(), SettleBound: settleBound.String(), MemoryLimit: deployedMemoryLimit,
		RestartReps: restartReps, LoadRate: loadRate, LoadDeletes: loadDeletes, LoadSteady: loadSteady.String()}
	bins, err := e.prepare()
	if err != nil {
		return out, err
	}
	bin, kubeconfig := bins.bridge, bins.config
	const ns, stream, prefix = "bench-memory", "BENCHMEM", "benchmem"
	if err := newNamespace(ctx, e, ns, true); err != nil {
		return out, err
	}
	metricsAddr, healthAddr, pprofAddr := freeAddr(), freeAddr(), freeAddr()
	args := []string{"--kubeconfig", kubeconfig, "--nats-url", e.st.NATS.URL(), "--leader-elect=false",
		"--metrics-bind-address", metricsAddr, "--health-probe-bind-address", healthAddr, "--pprof-bind-address", pprofAddr,
		"--namespaces", ns, "--stream-name", stream, "--records-bucket", stream + "_RECORDS", "--receipts-bucket", stream + "_RECEIPTS",
		"--subject-prefix", prefix, "--snapshot-request-subject", ""}
	limited := false // the process runs with the deployments' memoryLimit
	// The process keeps its ports from one start to the next: the
	// closures below read its metrics and profiles.
	startProc := func() (*child, time.Time, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = processEnv()
		if limited {
			cmd.Env = append(cmd.Env, goMemLimit())
		}
		t0 := time.Now()
		c, err := startChild(cmd)
		if err != nil {
			return nil, t0, err
		}
		return c, t0, c.waitHTTP("http://"+healthAddr+"/readyz", 60*time.Second)
	}
	cmd, _, err := startProc()
	if cmd != nil {
		defer func() { cmd.kill() }()
	}
	if err != nil {
		return out, err
	}
	time.Sleep(2 * time.Second)

	metrics := "http://" + metricsAddr + "/metrics"
	var republished uint64
	profiled := 0 // restarts, for the names of their CPU profiles
	// stop stops the bridge, counting what it published since its start:
	// after a restart with every Student published, only what changed
	// meanwhile should be, so the idle restarts count as republished.
	stop := func() {
		cmd.terminate()
		<-cmd.exited
	}
	// start starts the bridge again: how long until it is ready, and until
	// its start's catch-up ended (caught up: every Student that needed a
	// reconcile had it), and how long
	// that catch-up itself took (student_bridge_catch_up_duration_seconds).
	start := func() (ready, caughtUp, catchUp time.Duration, err error) {
		var t0 time.Time
		var c *child
		c, t0, err = startProc()
		if c != nil {
			cmd = c // the deferred kill's
		}
		if err != nil {
			return 0, 0, 0, err
		}
		ready = time.Since(t0)
		// With BENCH_PROFILE_DIR, where the restart's CPU goes.
		profiled++
		go saveProfile(pprofAddr, "profile?seconds=10", fmt.Sprintf("cpu-restart-%d.pb.gz", profiled))
		deadline := time.Now().Add(10 * time.Minute)
		for metric(metrics, "student_bridge_catch_up_duration_seconds_count") < 1 {
			if time.Now().After(deadline) {
				return 0, 0, 0, fmt.Errorf("restart: no catch-up ended within 10 minutes (%v Students queued by it)", metric(metrics, "student_bridge_catch_up_students"))
			}
			// Not more often: a scrape counts every Student's services.
			time.Sleep(250 * time.Millisecond)
		}
		// When it ended, by the bridge's clock: a scrape's own period
		// would add up to 250 ms to it.
		caughtUp = time.Unix(0, int64(metric(metrics, "student_bridge_catch_up_end_time_seconds")*1e9)).Sub(t0)
		return ready, caughtUp, time.Duration(metric(metrics, "student_bridge_catch_up_duration_seconds_sum") * float64(time.Second)), nil
	}
	// idleRestart restarts with every Student published: nothing should be
	// published again.
	idleRestart := func() (ready, caughtUp, catchUp time.Duration, err error) {
		stop()
		if ready, caughtUp, catchUp, err = start(); err != nil {
			return
		}
		time.Sleep(3 * time.Second)
		republished += uint64(metricSum(metrics, "student_bridge_events_published_total{"))
		return
	}
	sample := func() (rssKB int64, heapMB float64) {
		return procStatus(cmd.cmd.Process.Pid, "VmRSS"), metric(metrics, "go_memstats_heap_inuse_bytes") / 1e6
	}
	// settled samples the process once its memory settled after a start:
	// a garbage collection since the catch-up ended (the runtime forces
	// one every two minutes at rest), and RSS moving less than 1% in
	// settleWindow (the scavenger returns freed memory gradually). A
	// start's list leaves its peak in RSS for a while; a dashboard at
	// rest shows the settled figure. It reports how long settling took,
	// "(bound)" when it did not settle.
	settled := func() (m Memory, tookMS float64, bounded bool) {
		t0 := time.Now()
		var window []int64 // one sample a second
		for {
			rssKB, heapMB := sample()
			window = append(window, rssKB)
			if len(window) > int(settleWindow/time.Second)+1 {
				window = window[1:]
			}
			m, tookMS = memoryOf(rssKB, heapMB), toMS(time.Since(t0))
			gcSince := metric(metrics, "go_memstats_last_gc_time_seconds") > float64(t0.Add(-3*time.Second).UnixNano())/1e9
			if gcSince && len(window) > int(settleWindow/time.Second) && float64(slices.Max(window)-slices.Min(window)) < 0.01*float64(rssKB) {
				return m, tookMS, false
			}
			if time.Since(t0) > settleBound {
				return m, tookMS, true
			}
			time.Sleep(time.Second)
		}
	}
	// now is the process's memory now.
	now := func() Memory { return memoryOf(sample()) }

	out.Rest = now()
	created := 0
	deleted := map[string]bool{} // by the restarts under load
	// left are the Students created and not deleted.
	left := func() []string {
		var names []string
		for i := range created {
			if name := fmt.Sprintf("m-%d", i); !deleted[name] {
				names = append(names, name)
			}
		}
		return names
	}
	for _, n := range counts {
		if limited {
			stop()
			limited = false
			if _, _, _, err := start(); err != nil {
				return out, err
			}
		}
		before := streamMsgs(ctx, e, stream)
		if err := createStudents(ctx, e, ns, created, n); err != nil {
			return out, err
		}
		if err := waitStreamMsgs(ctx, e, stream, before+uint64(n-created), 20*time.Minute); err != nil {
			return out, err
		}
		created = n
		time.Sleep(3 * time.Second) // status writes and Events after the last publish
		c := ScaleCount{Students: n, Publishing: now()}
		profile(pprofAddr, fmt.Sprintf("heap-%d-publishing.pb.gz", n))

		// Restart with every Student already published. The new process
		// counts every publish it makes, also copies the stream would drop.
		ready, caughtUp, catchUp, err := idleRestart()
		if err != nil {
			return out, err
		}
		c.AfterRestart = now()
		c.Steady, c.SettledMs, c.Bounded = settled()
		profile(pprofAddr, fmt.Sprintf("heap-%d-steady.pb.gz", n))
		sync, err := informerSync(ctx, e, ns)
		if err != nil {
			return out, err
		}
		// The restart against a raw informer started as a process, which
		// pays what any controller's start does (a new process, discovery,
		// a heap that grows from nothing); alternating, restartReps of
		// each, as one of each moves with the machine's noise.
		restartsOf, catchUps := []time.Duration{caughtUp}, []time.Duration{catchUp}
		var syncsOf []time.Duration
		for i := range restartReps {
			d, err := informerProcessSync(bins, ns)
			if err != nil {
				return out, err
			}
			syncsOf = append(syncsOf, d)
			if i == restartReps-1 {
				break
			}
			_, d, cu, err := idleRestart()
			if err != nil {
				return out, err
			}
			restartsOf, catchUps = append(restartsOf, d), append(catchUps, cu)
		}
		slices.Sort(restartsOf)
		slices.Sort(catchUps)
		slices.Sort(syncsOf)
		live := left()
		c.Restart = Restart{Students: len(live), ReadyMs: toMS(ready), CaughtUpMs: msOfList(restartsOf), CatchUpMs: msOfList(catchUps),
			InformerProcessMs: msOfList(syncsOf), InformerMs: toMS(sync)}

		var gone []string
		c.UnderLoad, gone, err = restartUnderLoad(ctx, e, bins, ns, prefix, metrics, live, median(catchUps), stop, start)
		if err != nil {
			return out, err
		}
		for _, name := range gone {
			deleted[name] = true
		}

		// The same Students, with the deployments' memory limit.
		limited = true
		if _, _, _, err := idleRestart(); err != nil {
			return out, err
		}
		c.AfterRestartLimited = now()
		c.SteadyLimited, c.SettledLimitedMs, c.BoundedLimited = settled()
		out.Counts = append(out.Counts, c)
	}

	// Two services' receipts for every Student, written as the services
	// would: what the bridge holds for them.
	stop()
	limited = false
	if _, _, _, err := start(); err != nil {
		return out, err
	}
	out.Receipts.Before = now()
	nReceipts, err := writeReceipts(ctx, e, stream, benchServices)
	if err != nil {
		return out, err
	}
	deadline := time.Now().Add(10 * time.Minute)
	for metric(metrics, `student_bridge_receipts_total{result="applied"}`) < float64(nReceipts) {
		if time.Now().After(deadline) {
			return out, fmt.Errorf("the bridge did not read %d receipts within 10 minutes", nReceipts)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // the status writes they cause
	out.Receipts.Read = now()
	if _, _, _, err = idleRestart(); err != nil {
		return out, err
	}
	out.Receipts.Steady, _, _ = settled()
	out.Receipts.Students, out.Receipts.Receipts = len(left()), nReceipts
	out.Republished = republished

	// The same Students, published again by three replicas over shards.
	stop()
	if out.Failover, err = failoverAtScale(ctx, e, ns, left()); err != nil {
		return out, fmt.Errorf("failover: %w", err)
	}
	return out, nil
}

// The load of a restart under load.
const (
	loadRate    = 200
	loadDeletes = 100
	loadSteady  = 5 * time.Second
)

// changeSchool is the school a change of the load writes: the time it
// was made, so that whoever sees it can tell how long it took.
func changeSchool(at time.Time) string { return "t" + strconv.FormatInt(at.UnixNano(), 10) }

// changeMadeAt is when the change that wrote school was made (Unix ns),
// if the load wrote it.
func changeMadeAt(school string) (int64, bool) {
	at, err := strconv.ParseInt(strings.TrimPrefix(school, "t"), 10, 64)
	return at, err == nil && strings.HasPrefix(school, "t")
}

// restartUnderLoad changes the Students live (all published) at loadRate
// per second, stops the bridge, deletes some, starts it again while the
// changes go on and reports the catch-up against idle (the idle
// restart's), when the deletes were published and the live changes'
// latency. It returns the Students it deleted.
func restartUnderLoad(ctx context.Context, e *env, bins *binaries, ns, prefix, metricsURL string, live []string, idle time.Duration,
	stop func(), start func() (ready, caughtUp, catchUp time.Duration, err error)) (RestartUnderLoad, []string, error) {
	var out RestartUnderLoad
	n := len(live)
	doomed := min(loadDeletes, n/10)
	// The last ones are deleted; the others change.
	names, deleted := live[:n-doomed], live[n-doomed:]
	gone := map[string]bool{}
	for _, name := range deleted {
		gone[name] = true
	}

	type sample struct{ at, took time.Time }
	var mu sync.Mutex
	var samples []sample
	deletedAt := map[string]time.Time{}
	sub, err := e.nc.Subscribe(prefix+".>", func(msg *nats.Msg) {
		now := time.Now()
		r, err := stacktest.Decode(msg)
		if err != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		name := r.Data.Metadata.Name
		switch {
		case strings.HasSuffix(r.Event.Type(), ".deleted") && gone[name]:
			deletedAt[name] = now
		default:
			if at, ok := changeMadeAt(r.Data.Spec.School); ok {
				samples = append(samples, sample{at: time.Unix(0, at), took: now})
			}
		}
	})
	if err != nil {
		return out, nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()

	loadCtx, endLoad := context.WithCancel(ctx)
	defer endLoad()
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		tick := time.NewTicker(time.Second / loadRate)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-loadCtx.Done():
				return
			case <-tick.C:
			}
			patch := fmt.Sprintf(`{"spec":{"school":%q}}`, changeSchool(time.Now()))
			s := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: names[i%len(names)]}}
			_ = e.st.Client.Patch(loadCtx, s, client.RawPatch(types.MergePatchType, []byte(patch)))
		}
	}()

	steadyFrom := time.Now()
	time.Sleep(loadSteady)
	stopped := time.Now()
	stop()
	for name := range gone {
		s := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if err := e.st.Client.Delete(ctx, s); err != nil {
			return out, nil, fmt.Errorf("delete %s while the bridge is down: %w", name, err)
		}
	}
	started := time.Now()
	_, caughtUp, catchUp, err := start()
	if err != nil {
		return out, nil, err
	}
	catchUpEnd := started.Add(caughtUp)
	// Nothing can be published before the records are loaded and the
	// cache synced: the bridge says when that was.
	since := metric(metricsURL, "student_bridge_publishing_start_time_seconds")
	if since == 0 {
		return out, nil, fmt.Errorf("restart under load: the bridge says it never could publish")
	}
	publishing := time.Unix(0, int64(since*1e9))
	time.Sleep(2 * time.Second)
	// The reference: a raw informer starting as a process under the same
	// load. A change made while it lists waits for the list as well.
	rawSynced, rawDuring, err := informerProcessStartUnderLoad(bins, ns)
	if err != nil {
		return out, nil, err
	}
	endLoad()
	<-loadDone
	if err := stacktest.Eventually(5*time.Minute, func() error {
		mu.Lock()
		defer mu.Unlock()
		if published := len(deletedAt); published != doomed {
			return fmt.Errorf("restart under load: %d of %d deletes made while the bridge was down published", published, doomed)
		}
		return nil
	}); err != nil {
		return out, nil, err
	}
	time.Sleep(time.Second) // the last live changes' events

	mu.Lock()
	defer mu.Unlock()
	var lastDelete time.Time
	for _, at := range deletedAt {
		if at.After(lastDelete) {
			lastDelete = at
		}
	}
	var before, during, afterStart []time.Duration
	for _, s := range samples {
		switch {
		case !s.at.Before(steadyFrom) && s.at.Before(stopped):
			before = append(before, s.took.Sub(s.at))
		case !s.at.Before(started) && s.at.Before(catchUpEnd):
			during = append(during, s.took.Sub(s.at))
			if !s.at.Before(publishing) {
				afterStart = append(afterStart, s.took.Sub(s.at))
			}
		}
	}
	slices.Sort(before)
	slices.Sort(during)
	slices.Sort(afterStart)
	out = RestartUnderLoad{Students: n, IdleCatchUpMs: toMS(idle), CatchUpMs: toMS(catchUp), Deletes: doomed, DeletesPublishedMs: toMS(lastDelete.Sub(started)),
		Steady: latenciesOf(before), During: latenciesOf(during), CouldPublishMs: toMS(publishing.Sub(started)), AfterPublishing: latenciesOf(afterStart),
		InformerSyncedMs: toMS(rawSynced), InformerDuring: latenciesOf(rawDuring)}
	return out, deleted, nil
}

// informerProcessStartUnderLoad starts the raw informer as a process of
// its own ("informer-sync"), as a restart would, while the load runs: how
// long until its cache synced, and how long each change made from its
// start until then took to reach it.
func informerProcessStartUnderLoad(b *binaries, ns string) (time.Duration, []time.Duration, error) {
	t0 := time.Now()
	cmd := exec.Command(b.bench, "informer-sync", "-kubeconfig", b.config, "-namespace", ns, "-changes-since", strconv.FormatInt(t0.UnixNano(), 10))
	cmd.Stderr, cmd.Env = os.Stderr, processEnv()
	out, err := cmd.Output()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var synced int64
	if err == nil {
		_, err = fmt.Sscanf(lines[0], "synced %d", &synced)
	}
	if err != nil {
		return 0, nil, fmt.Errorf("informer-sync under load: %v, said %.200q", err, out)
	}
	var during []time.Duration
	for _, line := range lines[1:] {
		var change, seen int64
		if _, err := fmt.Sscanf(line, "%d %d", &change, &seen); err != nil {
			return 0, nil, fmt.Errorf("informer-sync under load: %q: %w", line, err)
		}
		if change < synced {
			during = append(during, time.Duration(seen-change))
		}
	}
	slices.Sort(during)
	return time.Duration(synced - t0.UnixNano()), during, nil
}

// informerProcessSync is how long the raw informer started as a process
// of its own ("informer-sync") takes from its start until its cache of the
// Students of ns synced.
func informerProcessSync(b *binaries, ns string) (time.Duration, error) {
	cmd := exec.Command(b.bench, "informer-sync", "-kubeconfig", b.config, "-namespace", ns)
	cmd.Stderr, cmd.Env = os.Stderr, processEnv()
	t0 := time.Now()
	out, err := cmd.Output()
	took := time.Since(t0)
	if err != nil || strings.TrimSpace(string(out)) != "synced" {
		return 0, fmt.Errorf("informer-sync: %v, said %q", err, out)
	}
	return took, nil
}

// informerSync is how long the raw informer variant's cache, new in this
// process, takes to list and watch the Students of ns until it synced.
func informerSync(ctx context.Context, e *env, ns string) (time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t0 := time.Now()
	c, inf, err := rawInformerCache(ctx, e.st.RestConfig, ns)
	if err != nil {
		return 0, err
	}
	go func() { _ = c.Start(ctx) }()
	if !informerSynced(ctx, inf) {
		return 0, fmt.Errorf("an informer on the Students of %s did not sync", ns)
	}
	return time.Since(t0), nil
}

// rounded shows d in seconds or milliseconds, rounded for a table.
func rounded(d time.Duration) string {
	if d >= time.Second {
		return d.Round(10 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

func createStudents(ctx context.Context, e *env, ns string, from, to int) error {
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	next := make(chan int)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				s := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("m-%d", i)},
					Spec: studentv1.StudentSpec{Name: fmt.Sprintf("student %d", i), School: "school"}}
				if err := e.st.Client.Create(ctx, s); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := from; i < to; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

func streamMsgs(ctx context.Context, e *env, stream string) uint64 {
	s, err := e.js.Stream(ctx, stream)
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

func waitStreamMsgs(ctx context.Context, e *env, stream string, n uint64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for streamMsgs(ctx, e, stream) < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("stream %s: %d of %d events after %s", stream, streamMsgs(ctx, e, stream), n, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// freeAddr is an address nothing listens on, for a process to listen on
// soon: below the kernel's ephemeral ports, so no connection made
// meanwhile takes it as its own (stack.FreePorts).
func freeAddr() string {
	port, err := stack.FreePorts(1)
	if err != nil {
		panic(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// profile saves a heap profile of the bridge process (after a GC) in
// BENCH_PROFILE_DIR, if set; read it with
// go tool pprof -sample_index=inuse_space <file>. A failure only loses it.
func profile(pprofAddr, name string) { saveProfile(pprofAddr, "heap?gc=1", name) }

// saveProfile saves the pprof profile of the process serving pprofAddr in
// BENCH_PROFILE_DIR, if set. A failure only loses it.
func saveProfile(pprofAddr, which, name string) {
	dir := os.Getenv("BENCH_PROFILE_DIR")
	if dir == "" {
		return
	}
	resp, err := http.Get("http://" + pprofAddr + "/debug/pprof/" + which)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if f, err := os.Create(filepath.Join(dir, name)); err == nil {
		_, _ = io.Copy(f, resp.Body)
		f.Close()
	}
}

// metric returns the value of the first sample whose line starts with name
// (a metric name, optionally with labels).
// metricSum adds up every series whose line starts with prefix.
func metricSum(url, prefix string) float64 {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var sum float64
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, prefix) {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			sum += v
		}
	}
	return sum
}

// metric is the value of the series name (with its labels, if any).
func metric(url, name string) float64 { return metricSum(url, name+" ") }

// writeReceipts writes, for every Student in the record store of stream,
// a receipt per service saying it applied the last published event. It
// returns how many it wrote.
func writeReceipts(ctx context.Context, e *env, stream string, services []string) (int, error) {
	records, err := e.js.KeyValue(ctx, stream+"_RECORDS")
	if err != nil {
		return 0, err
	}
	receipts, err := e.js.KeyValue(ctx, stream+"_RECEIPTS")
	if err != nil {
		return 0, err
	}
	w, err := records.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return 0, err
	}
	defer func() { _ = w.Stop() }()
	n := 0
	for entry := range w.Updates() {
		if entry == nil {
			break
		}
		rec, ok := contract.ParseRecord(entry.Key(), entry.Value())
		if !ok {
			continue // not a record (config.shards)
		}
		for _, svc := range services {
			b, _ := json.Marshal(studentv1.Receipt{Service: svc, UID: string(rec.UID), Namespace: rec.Namespace, Name: rec.Name,
				EventID: rec.Published.ID, Generation: rec.Published.Generation, Result: studentv1.ResultApplied, Time: metav1.Now()})
			if _, err := receipts.Put(ctx, studentv1.ReceiptKey(svc, string(rec.UID)), b); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}
