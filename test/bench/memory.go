package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/reconciler"
)

// memoryAndRestart runs the real binary as its own process, so its RSS and
// Go heap are its own: at rest, with each count of published Students, and
// the time a restart takes to be ready with them, and what it republished.
func memoryAndRestart(ctx context.Context, e *env, counts []int) (string, []memPoint, error) {
	bins, err := e.prepare()
	if err != nil {
		return "", nil, err
	}
	bin, kubeconfig := bins.bridge, bins.config
	const ns, stream = "bench-memory", "BENCHMEM"
	if err := newNamespace(ctx, e, ns, true); err != nil {
		return "", nil, err
	}
	metricsAddr, healthAddr, pprofAddr := freeAddr(), freeAddr(), freeAddr()
	args := []string{"--kubeconfig", kubeconfig, "--nats-url", e.st.NATS.URL(), "--leader-elect=false",
		"--metrics-bind-address", metricsAddr, "--health-probe-bind-address", healthAddr, "--pprof-bind-address", pprofAddr,
		"--namespaces", ns, "--stream-name", stream, "--state-bucket", stream + "_RECORDS", "--receipts-bucket", stream + "_RECEIPTS",
		"--subject-prefix", "benchmem", "--snapshot-request-subject", ""}
	startProc := func() (*exec.Cmd, time.Time, error) {
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		t0 := time.Now()
		if err := cmd.Start(); err != nil {
			return nil, t0, err
		}
		return cmd, t0, waitHTTP("http://"+healthAddr+"/readyz", 60*time.Second)
	}
	cmd, _, err := startProc()
	if err != nil {
		return "", nil, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	time.Sleep(2 * time.Second)

	metrics := "http://" + metricsAddr + "/metrics"
	reconciledOK := `controller_runtime_reconcile_total{controller="student-bridge",result="success"}`
	// restart stops the bridge and starts it again: how long until it is
	// ready, and until it has reconciled all n Students.
	restart := func(n int) (ready, reconciled time.Duration, err error) {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		var t0 time.Time
		if cmd, t0, err = startProc(); err != nil {
			return 0, 0, err
		}
		ready = time.Since(t0)
		deadline := time.Now().Add(5 * time.Minute)
		for metric(metrics, reconciledOK) < float64(n) {
			if time.Now().After(deadline) {
				return 0, 0, fmt.Errorf("restart: %d Students not reconciled within 5 minutes", n)
			}
			time.Sleep(20 * time.Millisecond)
		}
		return ready, time.Since(t0), nil
	}
	sample := func() (rssKB int64, heapMB float64) {
		return procStatus(cmd.Process.Pid, "VmRSS"), metric(metrics, "go_memstats_heap_inuse_bytes") / 1e6
	}

	var b strings.Builder
	b.WriteString("Memory of the bridge process (RSS and Go heap in use, from its own /metrics). \"Publishing\" is 3 s after the " +
		"last of the Students was published, with what creating them left for the garbage collector. " +
		"\"Steady\" is after a restart with every Student already published: the cost of watching them.\n\n" +
		"| Students | RSS MB publishing | heap MB publishing | RSS MB steady | heap MB steady |\n| --- | --- | --- | --- | --- |\n")
	rss0, heap0 := sample()
	fmt.Fprintf(&b, "| 0 | %.1f | %.1f | %.1f | %.1f |\n", float64(rss0)/1024, heap0, float64(rss0)/1024, heap0)
	points := []memPoint{{students: 0, rssPublishing: float64(rss0) / 1024, rssSteady: float64(rss0) / 1024, heapPublishing: heap0, heapSteady: heap0}}
	created := 0
	steady := map[int]int64{}
	var readyAt, reconciled time.Duration
	var republished uint64
	for _, n := range counts {
		if err := createStudents(ctx, e, ns, created, n); err != nil {
			return "", nil, err
		}
		created = n
		if err := waitStreamMsgs(ctx, e, stream, uint64(n), 10*time.Minute); err != nil {
			return "", nil, err
		}
		time.Sleep(3 * time.Second) // status writes and Events after the last publish
		rss, heap := sample()
		profile(pprofAddr, fmt.Sprintf("heap-%d-publishing.pb.gz", n))

		// Restart with every Student already published. The new process
		// counts every publish it makes, also copies the stream would drop.
		if readyAt, reconciled, err = restart(n); err != nil {
			return "", nil, err
		}
		time.Sleep(3 * time.Second)
		republished += uint64(metricSum(metrics, "student_bridge_events_published_total{"))
		rssSteady, heapSteady := sample()
		steady[n] = rssSteady
		profile(pprofAddr, fmt.Sprintf("heap-%d-steady.pb.gz", n))
		fmt.Fprintf(&b, "| %d | %.1f | %.1f | %.1f | %.1f |\n", n, float64(rss)/1024, heap, float64(steady[n])/1024, heapSteady)
		points = append(points, memPoint{students: n, rssPublishing: float64(rss) / 1024, rssSteady: float64(steady[n]) / 1024, heapPublishing: heap, heapSteady: heapSteady})
	}
	lo, hi := counts[0], counts[len(counts)-1]
	if hi > lo {
		fmt.Fprintf(&b, "\nSteady RSS slope between %d and %d Students: %.2f KB per Student.\n", lo, hi, float64(steady[hi]-steady[lo])/float64(hi-lo))
	}

	// Two services' receipts for every Student, written as the services
	// would: what the bridge holds for them.
	rssBefore, heapBefore := sample()
	n, err := writeReceipts(ctx, e, stream, benchServices)
	if err != nil {
		return "", nil, err
	}
	deadline := time.Now().Add(5 * time.Minute)
	for metric(metrics, `student_bridge_receipts_total{result="applied"}`) < float64(n) {
		if time.Now().After(deadline) {
			return "", nil, fmt.Errorf("the bridge did not read %d receipts within 5 minutes", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // the status writes they cause
	rssReceipts, heapReceipts := sample()
	if _, _, err = restart(hi); err != nil {
		return "", nil, err
	}
	time.Sleep(3 * time.Second)
	rssSteadyR, heapSteadyR := sample()
	fmt.Fprintf(&b, "\nWith two services' receipts for each of the %d Students (%d receipts): RSS %.1f MB, heap %.1f MB once read (%.1f MB, %.1f MB before); steady after a restart RSS %.1f MB, heap %.1f MB: %.2f KB RSS per Student more than without (steady).\n",
		hi, n, float64(rssReceipts)/1024, heapReceipts, float64(rssBefore)/1024, heapBefore, float64(rssSteadyR)/1024, heapSteadyR, float64(rssSteadyR-steady[hi])/float64(hi))

	// The raw reference: how long an informer takes to sync the same Students.
	t1 := time.Now()
	c, err := cache.New(e.st.RestConfig, cache.Options{Scheme: e.st.Client.Scheme(), DefaultNamespaces: map[string]cache.Config{ns: {}}})
	if err != nil {
		return "", nil, err
	}
	ictx, cancel := context.WithCancel(ctx)
	defer cancel()
	if _, err := c.GetInformer(ictx, &studentv1.Student{}); err != nil {
		return "", nil, err
	}
	go func() { _ = c.Start(ictx) }()
	c.WaitForCacheSync(ictx)
	informerSync := time.Since(t1)

	fmt.Fprintf(&b, "\nRestart with %d published Students: ready (/readyz) after %s, every Student reconciled after %s; raw informer sync of the same Students %s; events republished (all restarts): %d.\n",
		hi, readyAt.Round(10*time.Millisecond), reconciled.Round(10*time.Millisecond), informerSync.Round(10*time.Millisecond), republished)
	return b.String(), points, nil
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

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func waitHTTP(url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not OK after %s", url, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
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
		rec, ok := reconciler.ParseRecord(entry.Key(), entry.Value())
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
