// Command bench measures student-bridge end to end on the local stack (real
// kube-apiserver + etcd, embedded JetStream with file storage), side by side
// with what the machine can do, in one run: the NATS ceiling, the watch
// floor, a raw informer-to-JetStream reference, and the bridge with and
// without Kubernetes Events. It prints a markdown table and writes it to a
// results file. `make bench` runs it; its smoke mode runs in `make test`.
//
// BENCH_WORKERS overrides the bridge's workers; BENCH_PROFILE_DIR writes a
// goroutine profile of this process halfway through each run (to see where
// the bridge waits), a CPU profile of the middle half of the run of each
// bridge and informer running as a process, and heap profiles of the bridge process in
// the memory phase; BENCH_LOG writes the bridge's debug log to a file;
// BENCH_DEBUG prints every lost final state with its receipts, the object
// and its events in the stream; BENCH_GOMAXPROCS sets GOMAXPROCS in every
// bridge and informer process it starts (not in its own, nor in the API
// server's), and the results file's command says so.
package main

import (
	"bufio"
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/internal/stages"
)

// selected reports whether a variant named name runs with -only only:
// every variant without it, else those whose name contains one of its
// comma-separated parts.
func selected(name, only string) bool {
	if only == "" {
		return true
	}
	// A comma followed by a space is part of a name ("3 replicas, 16
	// shards"), not a separator.
	var parts []string
	for _, part := range strings.Split(only, ",") {
		if strings.HasPrefix(part, " ") && len(parts) > 0 {
			parts[len(parts)-1] += "," + part
			continue
		}
		parts = append(parts, part)
	}
	for _, part := range parts {
		if exact, ok := strings.CutPrefix(part, "="); ok && name == exact || !ok && part != "" && strings.Contains(name, part) {
			return true
		}
	}
	return false
}

// dataPath is where the results as data go beside the markdown out:
// results.md, results.json.
func dataPath(out string) string { return strings.TrimSuffix(out, filepath.Ext(out)) + ".json" }

// cellKey names a cell of the results: a variant at a rate.
type cellKey struct {
	variant string
	rate    int
}

type options struct {
	rates    []int
	duration time.Duration
	reps     int
	students []int // Student counts of the memory and restart phase
	out      string
	only     string
	// idle is how long the counts phase counts the requests at rest; 0
	// skips that row.
	idle time.Duration
	// memorySettle bounds the wait for a restarted bridge's memory to
	// settle before steady memory is sampled.
	memorySettle time.Duration
	// counts are the rates the counts phase changes Students at; empty
	// skips it.
	counts []int
	// bisect narrows each variant's highest sustained rate to within 10%
	// between the rates of the grid.
	bisect bool
	// goBench is how many times the Go benchmark of one change's path
	// runs; 0 skips it.
	goBench int
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "raw-informer" {
		os.Exit(rawInformerMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "informer-sync" {
		os.Exit(informerSyncMain(os.Args[2:]))
	}
	var o options
	var rates, students, countRates, renderFrom string
	var docs bool
	flag.StringVar(&rates, "rates", "50,100,200,300,500,1000", "Change rates (changes/s) to run, comma separated.")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "How long the generator runs per variant and rate.")
	flag.BoolVar(&docs, "docs", false, "Render the benchmark blocks of README.md and docs/*.md again from the results files they name, in place, and run nothing.")
	flag.StringVar(&renderFrom, "render", "", "Print the load tables of this results file (a run's .json beside its .md) and run nothing.")
	flag.IntVar(&o.reps, "reps", 3, "Repetitions of every (variant, rate); the table shows the median and the min-max.")
	flag.StringVar(&students, "students", "1000,10000,100000", "Student counts for the memory and restart measurements (the slopes are between the first and the last); empty skips them.")
	flag.StringVar(&o.out, "out", "bench-results/results.md", "Results file (markdown).")
	flag.StringVar(&o.only, "only", "", "Run only variants whose name contains this (or one of these, comma separated; =name: that name exactly).")
	flag.StringVar(&countRates, "counts", "1,100", "Rates (changes/s) at which the counts phase counts each operation's requests, three bridge processes over 16 shards; empty skips it.")
	flag.DurationVar(&o.idle, "idle", 30*time.Second, "How long the counts phase counts the requests at rest; 0 skips that.")
	flag.BoolVar(&o.bisect, "bisect", true, "Narrow each variant's highest sustained rate to within 10% by bisection between the grid's rates.")
	flag.DurationVar(&o.memorySettle, "memory-settle", 150*time.Second, "How long a restarted bridge's memory may take to settle (a garbage collection, then RSS within 1% for 10s) "+
		"before steady memory is sampled anyway; past the Go runtime's forced collection every two minutes.")
	flag.IntVar(&o.goBench, "go-bench", 5, "Runs of the Go benchmark of one change's path inside the bridge (reconciler "+goBenchName+", "+goBenchTime+" each), before everything else; 0 skips it.")
	flag.DurationVar(&settleQuiet, "settle", 2*time.Second, "A run has settled when no event arrived for this long.")
	flag.Parse()
	if docs {
		if err := renderDocs(docPaths); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if renderFrom != "" {
		tables, err := render(renderFrom)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		fmt.Print(tables)
		return
	}
	o.rates = ints(rates)
	o.students = ints(students)
	o.counts = ints(countRates)
	if dir := os.Getenv("BENCH_PROFILE_DIR"); dir != "" {
		// Made here, not found missing once the first cell is measured.
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "bench: BENCH_PROFILE_DIR:", err)
			os.Exit(1)
		}
	}
	if v := os.Getenv("BENCH_GOMAXPROCS"); v != "" {
		// The Go runtime ignores a GOMAXPROCS it cannot read, and the
		// results file's command would claim it.
		if n, err := strconv.Atoi(v); err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bench: BENCH_GOMAXPROCS=%q: want a number of at least 1\n", v)
			os.Exit(1)
		}
	}
	logTo := io.Discard
	if f := os.Getenv("BENCH_LOG"); f != "" {
		if lf, err := os.Create(f); err == nil {
			logTo = lf
		}
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(logTo), zap.UseDevMode(os.Getenv("BENCH_LOG") != "")))
	if err := bench(context.Background(), o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func ints(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil {
			out = append(out, n)
		}
	}
	return out
}

func bench(ctx context.Context, o options, stdout io.Writer) error {
	var oneChange *GoBench
	if o.goBench > 0 {
		g, err := goBench(o.goBench)
		if err != nil {
			return fmt.Errorf("the Go benchmark: %w", err)
		}
		oneChange = &g
		fmt.Fprint(os.Stderr, goBenchTable(g))
	}
	st, err := stack.Start(stack.Options{})
	if err != nil {
		return err
	}
	defer func() { _ = st.Stop() }()
	nc, err := nats.Connect(st.NATS.URL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return err
	}
	synced, err := syncedNATS()
	if err != nil {
		return err
	}
	defer synced.close()
	cluster, err := clusterNATS()
	if err != nil {
		return err
	}
	defer cluster.close()
	e := &env{st: st, url: st.NATS.URL(), nc: nc, js: js, replicas: 1, synced: synced.env, cluster: cluster.env, bins: &binaries{}}
	defer e.bins.cleanup()
	for _, o := range []*env{synced.env, cluster.env} {
		o.st, o.bins = st, e.bins
	}
	// The finalizer policy of deploy/default, bound to the bridge's
	// namespaces only: in the others no bridge would ever remove it.
	if err := stack.InstallFinalizerPolicy(st.RestConfig, st.Client, policyLabels); err != nil {
		return err
	}
	benchDuration = o.duration

	type task struct {
		v    variant
		rate int
		rep  int
	}
	var tasks []task
	for rep := range o.reps {
		for _, v := range variants {
			if !selected(v.name, o.only) {
				continue
			}
			for _, rate := range o.rates {
				tasks = append(tasks, task{v, rate, rep})
			}
		}
	}
	rand.Shuffle(len(tasks), func(i, j int) { tasks[i], tasks[j] = tasks[j], tasks[i] })
	results := map[cellKey][]result{}
	for i, t := range tasks {
		r, err := runOne(ctx, e, t.v, t.rate, fmt.Sprintf("r%d", i))
		if err != nil {
			return fmt.Errorf("%s at %d/s: %w", t.v.name, t.rate, err)
		}
		fmt.Fprintf(os.Stderr, "[%d/%d] %-32s %5d/s p99 %-8s covered %d/%d lost %d\n", i+1, len(tasks), t.v.name, t.rate, r.p99.Round(time.Millisecond), r.covered, r.made, r.lostFinal)
		results[cellKey{t.v.name, t.rate}] = append(results[cellKey{t.v.name, t.rate}], r)
	}

	data := newResults(o, results)
	data.OneChange = oneChange
	var b strings.Builder
	b.WriteString(loadTables(data))
	if oneChange != nil {
		b.WriteString("\n### One change inside the bridge\n\n" + goBenchTable(*oneChange))
	}
	if len(o.counts) > 0 {
		c, err := counts(ctx, e, o.counts, o.idle)
		if err != nil {
			return fmt.Errorf("counts: %w", err)
		}
		data.Counts = &c
		b.WriteString("\n" + countsTable(c))
	}
	sustained := sustainedRates(o.rates, results)
	probeRuns := 0 // names each probe's namespace and stream
	for _, v := range variants {
		if len(o.rates) == 0 {
			break // -rates "": the memory and restart phase only
		}
		if _, ok := results[cellKey{v.name, o.rates[0]}]; !ok {
			continue
		}
		c := Capacity{Variant: v.name, Rate: sustained[v.name], AtTop: sustained[v.name] == slices.Max(o.rates)}
		hi := 0
		for _, rate := range o.rates {
			if rate > c.Rate && (hi == 0 || rate < hi) {
				hi = rate
			}
		}
		// Bisection: each probe runs o.reps times at the middle rate.
		for o.bisect && c.Rate > 0 && hi > 0 && float64(hi-c.Rate) > 0.1*float64(c.Rate) {
			mid := (c.Rate + hi) / 2
			var rs []result
			for range o.reps {
				probeRuns++
				r, err := runOne(ctx, e, v, mid, fmt.Sprintf("b%d", probeRuns))
				if err != nil {
					return fmt.Errorf("%s at %d/s: %w", v.name, mid, err)
				}
				rs = append(rs, r)
			}
			p := Probe{Rate: mid, Kept: kept(rs), P99Ms: toMS(median(durations(rs, func(r result) time.Duration { return r.p99 })))}
			c.Probes = append(c.Probes, p)
			fmt.Fprintf(os.Stderr, "bisect %-32s %s\n", v.name, p)
			if p.Kept {
				c.Rate = mid
			} else {
				hi = mid
			}
		}
		data.Capacity = append(data.Capacity, c)
	}
	if len(data.Capacity) > 0 {
		b.WriteString("\n" + capacityList(data.Capacity))
	}
	eachCell(o.rates, results, func(v variant) bool { return v.services }, func(v variant, rate int, rs []result) {
		var lat []time.Duration
		var applied int64
		for _, r := range rs {
			lat = append(lat, r.receiptToStatus...)
			applied += r.applied
		}
		slices.Sort(lat)
		if len(lat) == 0 {
			fmt.Fprintf(&b, "\n%s at %d/s: no receipt showed on a Student before the run ended (%d applied).\n", v.name, rate, applied)
			return
		}
		fmt.Fprintf(&b, "\n%s at %d/s: a service's receipt shows on the Student after p50 %s, p99 %s (%d of %d applied changes seen in sync; the others were coalesced into a later status write of the same Student).\n",
			v.name, rate, lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)*99/100].Round(time.Millisecond), len(lat), applied)
	})
	if len(o.students) > 0 {
		s, err := memoryAndRestart(ctx, e, o.students, o.memorySettle)
		if err != nil {
			return fmt.Errorf("memory and restart: %w", err)
		}
		b.WriteString("\n" + scaleTables(s))
		data.Scale = &s
	}
	fmt.Fprint(stdout, b.String())
	if o.out == "" {
		return nil
	}
	// The results, and next to them the charts of the same run.
	dir := filepath.Dir(o.out)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(o.out, []byte(b.String()), 0o644); err != nil {
		return err
	}
	if err := writeResults(dataPath(o.out), data); err != nil {
		return err
	}
	if len(o.rates) > 0 { // a run without the load phase leaves the last one's chart
		if err := latencyChart(filepath.Join(dir, "latency.svg"), o.rates, results); err != nil {
			return err
		}
	}
	if data.Scale != nil {
		if err := memoryChart(filepath.Join(dir, "memory.svg"), *data.Scale); err != nil {
			return err
		}
		return restartChart(filepath.Join(dir, "restart.svg"), *data.Scale)
	}
	return nil
}

// loadTitle is the title of a results file.
const loadTitle = "## student-bridge benchmark\n\n"

// loadTables are the load phase's tables of res: every cell, where the
// time goes, capacity.
func loadTables(res Results) string {
	results := res.cells()
	var b strings.Builder
	fmt.Fprintf(&b, loadTitle+"%s, commit %s, %d CPUs, %s; %d reps of %s per cell, randomized order; median (min-max).\n\n",
		res.Date, cmp.Or(res.Commit, "unknown"), res.Machine.CPUs, res.Machine.Go, res.Reps, res.Duration)
	b.WriteString("| variant | rate/s | p50 ms | p99 ms | p99.9 ms | coverage | lost final | unobserved | dup | Student writes/change | k8s Events/change | CPU s/1k changes | own processes CPU s/1k changes | API server+etcd CPU s/1k changes | NATS messages sent/received per change | kept up |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	eachCell(res.Rates, results, func(variant) bool { return true }, func(v variant, rate int, rs []result) {
		p99s := durations(rs, func(r result) time.Duration { return r.p99 })
		lost, unobserved, dup, made, covered := 0, 0, 0, 0, 0
		var writes, events int64
		var cpu, cpCPU, own, sent, received float64
		for _, r := range rs {
			own += r.ownCPU
			sent += r.natsSent
			received += r.natsReceived
			lost += r.lostFinal
			unobserved += r.unobserved
			dup += r.duplicates
			made += r.made
			covered += r.covered
			writes += r.studentWrites
			events += r.eventWrites
			cpu += r.cpuSeconds
			cpCPU += r.controlPlaneCPU
		}
		wpc, epc := "-", "-"
		if v.bridge {
			wpc = fmt.Sprintf("%.3f", float64(writes)/float64(made))
			epc = fmt.Sprintf("%.2f", float64(events)/float64(made))
		}
		ownPC, natsPC := "-", "-"
		if own > 0 {
			ownPC = fmt.Sprintf("%.2f", own/float64(made)*1000)
		}
		if sent > 0 {
			natsPC = fmt.Sprintf("%.2f / %.2f", sent/float64(made), received/float64(made))
		}
		keptUp := kept(rs)
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %d/%d | %d | %d | %d | %s | %s | %.2f | %s | %.2f | %s | %v |\n", v.name, rate,
			spread(durations(rs, func(r result) time.Duration { return r.p50 })), spread(p99s),
			spread(durations(rs, func(r result) time.Duration { return r.p999 })),
			covered, made, lost, unobserved, dup, wpc, epc, cpu/float64(made)*1000, ownPC, cpCPU/float64(made)*1000, natsPC, keptUp)
	})
	b.WriteString(stageTable(res.Rates, results))
	if len(res.Rates) > 0 {
		b.WriteString(capacityTable(res.Rates, results))
	}
	return b.String()
}

// sustainedRates is each variant's highest rate of the grid it kept up
// with.
func sustainedRates(rates []int, results map[cellKey][]result) map[string]int {
	sustained := map[string]int{}
	eachCell(rates, results, func(variant) bool { return true }, func(v variant, rate int, rs []result) {
		if kept(rs) && rate > sustained[v.name] {
			sustained[v.name] = rate
		}
	})
	return sustained
}

// stageTable shows where the time of a change goes in the bridge: each
// stage's p50 and p99 per bridge variant and rate, from the stage
// histograms of all repetitions of the cell together.
func stageTable(rates []int, results map[cellKey][]result) string {
	var b strings.Builder
	b.WriteString("\nWhere the time goes (student_bridge_stage_duration_seconds, p50 / p99 ms, all repetitions of a cell; replicas together):\n\n")
	b.WriteString("| variant | rate/s |")
	for _, s := range stages.All {
		fmt.Fprintf(&b, " %s |", s)
	}
	b.WriteString("\n| --- | --- |" + strings.Repeat(" --- |", len(stages.All)) + "\n")
	eachCell(rates, results, func(v variant) bool { return v.bridge }, func(v variant, rate int, rs []result) {
		fmt.Fprintf(&b, "| %s | %d |", v.name, rate)
		for _, s := range stages.All {
			var h stages.Histogram
			for _, r := range rs {
				h = stages.Add(h, r.stages[s])
			}
			if h.Count == 0 {
				b.WriteString(" - |")
				continue
			}
			fmt.Fprintf(&b, " %s / %s |", ms(h.Quantile(0.5)), ms(h.Quantile(0.99)))
		}
		b.WriteString("\n")
	})
	return b.String()
}

// capacityTable compares the variants' drain rates at the grid's highest
// rate, where (run far beyond what they sustain) the rate is their
// capacity: median and range of the repetitions, and for each variant
// whether its range overlaps the raw informer's. Beside it, what a change
// cost in CPU on the whole machine, and how many CPUs that kept busy
// while draining: where they are all busy, the capacity is the machine's
// CPUs over the CPU per change, wherever in the stack that CPU goes.
func capacityTable(rates []int, results map[cellKey][]result) string {
	top := slices.Max(rates)
	var b strings.Builder
	fmt.Fprintf(&b, "\nCapacity: changes covered per second at %d/s (from the first change to the last event covering one; beyond a variant's capacity, its capacity), median (min-max) of the repetitions; the CPU a change cost on the whole machine (the benchmark's process, the variant's processes, kube-apiserver and etcd), and the CPUs that kept busy while draining:\n\n", top)
	b.WriteString("| variant | drained changes/s | against raw-informer | all CPU ms/change | of it, API server+etcd | CPUs busy |\n| --- | --- | --- | --- | --- | --- |\n")
	all := func(r result) float64 { return (r.cpuSeconds + r.ownCPU + r.controlPlaneCPU) / float64(r.made) * 1000 }
	controlPlane := func(r result) float64 { return r.controlPlaneCPU / float64(r.made) * 1000 }
	busy := func(r result) float64 { return all(r) / 1000 * r.drained }
	drained := func(r result) float64 { return r.drained }
	rawLo, rawMed, rawHi := 0.0, 0.0, 0.0
	raw := results[cellKey{"raw-informer", top}]
	if len(raw) > 0 {
		rawLo, rawMed, rawHi = spanOf(raw, drained)
	}
	eachCell([]int{top}, results, func(variant) bool { return true }, func(v variant, _ int, rs []result) {
		lo, med, hi := spanOf(rs, drained)
		cmp := "-"
		switch {
		case len(raw) == 0 || v.name == "raw-informer":
		case hi < rawLo || lo > rawHi:
			cmp = fmt.Sprintf("%.2fx", med/rawMed)
		default:
			cmp = fmt.Sprintf("%.2fx, not distinguishable (ranges overlap)", med/rawMed)
		}
		fmt.Fprintf(&b, "| %s | %.0f (%.0f-%.0f) | %s | %s | %s | %s |\n", v.name, med, lo, hi, cmp, spanText(rs, all), spanText(rs, controlPlane), spanText(rs, busy))
	})
	return b.String()
}

// eachCell calls do for every cell with results of a variant that in
// selects, in the order of variants and rates.
func eachCell(rates []int, results map[cellKey][]result, in func(variant) bool, do func(v variant, rate int, rs []result)) {
	for _, v := range variants {
		if !in(v) {
			continue
		}
		for _, rate := range rates {
			if rs := results[cellKey{v.name, rate}]; len(rs) > 0 {
				do(v, rate, rs)
			}
		}
	}
}

// kept reports whether a cell kept up: the generator on schedule, no lost
// final state, median p99 under a second.
func kept(rs []result) bool {
	lost, behind := 0, false
	for _, r := range rs {
		lost += r.lostFinal
		behind = behind || r.behind
	}
	return !behind && lost == 0 && median(durations(rs, func(r result) time.Duration { return r.p99 })) < time.Second
}

func runOne(ctx context.Context, e *env, v variant, rate int, id string) (result, error) {
	e = e.forVariant(v)
	r := &run{id: id, ns: "bench-" + id, prefix: "bench" + id, stream: "BENCH" + strings.ToUpper(id), tr: newTracker()}
	if v.k8s {
		if err := newNamespace(ctx, e, r.ns, v.policy); err != nil {
			return result{}, err
		}
	}
	stop, err := v.start(ctx, e, r)
	if err != nil {
		return result{}, err
	}
	if v.k8s {
		if err := warmup(ctx, e, r); err != nil {
			stop()
			return result{}, err
		}
	}
	var profiled sync.WaitGroup
	var summaries []func() (Profile, error)
	if dir := os.Getenv("BENCH_PROFILE_DIR"); dir != "" {
		// Mid-run profiles of this process (generator, NATS and, for the
		// bridge variants, the bridge itself): where the bridge waits.
		// The CPU and allocations of the bridge or informer processes
		// over the middle half, which the results summarise (Profile).
		seconds := max(1, int(benchDuration/2/time.Second))
		for i, p := range r.procs {
			if p.pprof != "" {
				cpu, allocs := fmt.Sprintf("%s-process%d-cpu.pb.gz", id, i), fmt.Sprintf("%s-process%d-allocs.pb.gz", id, i)
				profiled.Add(2)
				go func() {
					defer profiled.Done()
					time.Sleep(benchDuration / 4)
					saveProfile(p.pprof, fmt.Sprintf("profile?seconds=%d", seconds), cpu)
				}()
				go func() {
					defer profiled.Done()
					time.Sleep(benchDuration / 4)
					saveProfile(p.pprof, fmt.Sprintf("allocs?seconds=%d", seconds), allocs)
				}()
				summaries = append(summaries, func() (Profile, error) {
					return summarise(i, float64(seconds), filepath.Join(dir, cpu), filepath.Join(dir, allocs))
				})
			}
		}
		go func() {
			time.Sleep(benchDuration / 2)
			f, err := os.Create(filepath.Join(dir, id+"-goroutines.txt"))
			if err == nil {
				_ = pprof.Lookup("goroutine").WriteTo(f, 1)
				f.Close()
			}
		}()
	}
	cpu0, cp0 := cpuSeconds(), controlPlaneCPU()
	stages0, err := stages.Snapshot()
	var own0 usage
	if err == nil && len(r.procs) > 0 {
		own0, err = r.usage()
	}
	if err != nil {
		stop()
		return result{}, err
	}
	var behind bool
	if v.k8s {
		behind = generate(ctx, e.st.Client, r.ns, rate, durationFor(rate), r.tr, uint64(time.Now().UnixNano()))
	} else {
		behind = publishCeiling(ctx, e, r, rate, durationFor(rate))
	}
	settle(r.tr)
	profiled.Wait()
	cpu, cpCPU := cpuSeconds()-cpu0, controlPlaneCPU()-cp0
	stages1, err := stages.Snapshot()
	var own1 usage
	if err == nil && len(r.procs) > 0 {
		own1, err = r.usage()
	}
	stop()
	if err != nil {
		return result{}, err
	}
	res := r.tr.result(v.name, rate)
	res.stages = stages.Since(stages0, stages1)
	if os.Getenv("BENCH_DEBUG") != "" {
		for _, n := range res.lostNames {
			var s studentv1.Student
			err := e.st.Client.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: n}, &s)
			fmt.Fprintf(os.Stderr, "lost %s: get err=%v finalizers=%v deleting=%v lastPublished=%+v\n", n, err, s.Finalizers, s.DeletionTimestamp, s.Status.LastPublished)
		}
		if len(res.lostNames) > 0 {
			evs, err := stacktest.StreamEvents(ctx, e.nc, r.stream)
			fmt.Fprintf(os.Stderr, "stream %s: %d events (err %v)\n", r.stream, len(evs), err)
			for _, ev := range evs {
				if ev.Data.Metadata.UID == "" || ev.Data.Metadata.Name == "" {
					fmt.Fprintf(os.Stderr, "  EMPTY #%d %s %q id %s\n", ev.Sequence, ev.Event.Type(), ev.Data.Metadata.Name, ev.Event.ID())
				}
			}
			for _, ev := range evs {
				for _, n := range res.lostNames {
					if ev.Data.Metadata.Name == n {
						fmt.Fprintf(os.Stderr, "  #%d %s %s id %s uid %s\n", ev.Sequence, ev.Event.Type(), n, ev.Event.ID(), ev.Data.Metadata.UID)
					}
				}
			}
		}
	}
	res.behind = behind
	res.studentWrites, res.eventWrites = r.studentWrites.Load(), r.eventWrites.Load()
	if len(r.procs) > 0 {
		// The variant's own processes: their CPU, and what the bridges
		// say of their writes (Lease renewals counted with the Students'
		// writes) and stages.
		res.ownCPU = own1.cpu - own0.cpu
		res.natsSent, res.natsReceived = own1.natsSent-own0.natsSent, own1.natsReceived-own0.natsReceived
		res.eventWrites = int64(own1.events - own0.events)
		res.studentWrites = int64(own1.writes-own0.writes) - res.eventWrites
		res.stages = stages.Since(own0.stages, own1.stages)
	}
	res.cpuSeconds = cpu
	res.controlPlaneCPU = cpCPU
	for _, summary := range summaries {
		p, err := summary()
		if err != nil {
			return result{}, fmt.Errorf("profile of %s: %w", id, err)
		}
		res.profiles = append(res.profiles, p)
	}
	r.mu.Lock()
	res.receiptToStatus, res.applied = r.receiptToStatus, r.applied.Load()
	r.mu.Unlock()
	_ = e.js.DeleteStream(ctx, r.stream)
	if v.k8s {
		if err := removeStudents(ctx, e, r.ns); err != nil {
			return result{}, err
		}
	}
	return res, nil
}

// removeStudents deletes what a run left in its namespace, so that later runs
// do not carry its Students. (The API server and etcd still carry some of
// the work of a heavy run; see docs/performance.md.) The bridge has stopped, so its
// finalizers are removed by hand.
func removeStudents(ctx context.Context, e *env, ns string) error {
	var list studentv1.StudentList
	if err := e.st.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return err
	}
	work := make(chan *studentv1.Student)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range work {
				err := e.st.Client.Patch(ctx, s, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
				if err != nil && !apierrors.IsNotFound(err) {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := range list.Items {
		if len(list.Items[i].Finalizers) > 0 {
			work <- &list.Items[i]
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return fmt.Errorf("remove finalizers in %s: %w", ns, err)
	default:
	}
	if err := e.st.Client.DeleteAllOf(ctx, &studentv1.Student{}, client.InNamespace(ns)); err != nil {
		return fmt.Errorf("delete Students in %s: %w", ns, err)
	}
	return nil
}

var benchDuration = 10 * time.Second

func durationFor(int) time.Duration { return benchDuration }

// warmup creates one Student and waits until the variant delivered it, so
// that start-up (cache sync, stream creation) is not measured as latency.
func warmup(ctx context.Context, e *env, r *run) error {
	name := "warmup-" + r.id
	s := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: name}, Spec: studentv1.StudentSpec{Name: name, School: "s"}}
	if err := e.st.Client.Create(ctx, s); err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for !r.tr.seen(name) {
		if time.Now().After(deadline) {
			return fmt.Errorf("warm-up Student not delivered within 60s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// settleQuiet is how long no event may arrive before a run counts as
// settled. Events can come later than that: a Student whose reconcile failed
// waits out its backoff (up to retry.maxDelay).
var settleQuiet = 2 * time.Second

// settle waits until no event arrived for settleQuiet (at most 60s).
func settle(tr *tracker) {
	deadline := time.Now().Add(60 * time.Second)
	last, quiet := -1, time.Now()
	for time.Now().Before(deadline) {
		tr.mu.Lock()
		n := tr.events
		tr.mu.Unlock()
		if n != last {
			last, quiet = n, time.Now()
		} else if time.Since(quiet) > settleQuiet {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func durations(rs []result, f func(result) time.Duration) []time.Duration {
	var out []time.Duration
	for _, r := range rs {
		out = append(out, f(r))
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func median(d []time.Duration) time.Duration { return d[len(d)/2] }

// ms shows d in milliseconds with one decimal.
func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 1, 64)
}

func spread(d []time.Duration) string { return spreadAs(d, ms) }

// spreadAs shows sorted durations as their median (min-max), each shown
// by show.
func spreadAs(d []time.Duration, show func(time.Duration) string) string {
	if len(d) == 1 {
		return show(d[0])
	}
	return fmt.Sprintf("%s (%s-%s)", show(median(d)), show(d[0]), show(d[len(d)-1]))
}

// cpuSeconds is this process's user+system CPU time.
func cpuSeconds() float64 { return processCPU(os.Getpid()) }

// procStatus reads a field (kB) of /proc/<pid>/status.
func procStatus(pid int, field string) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), field+":") {
			n, _ := strconv.ParseInt(strings.Fields(sc.Text())[1], 10, 64)
			return n
		}
	}
	return 0
}
