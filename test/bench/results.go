package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stages"
)

// Results is a run as data: where, when and how it ran, every
// repetition of every cell of the load phase, and the other phases' results. The run writes it beside its markdown
// (results.json); -render prints the load tables from such a file with the
// same code the run used, so a committed file renders the same tables
// again.
type Results struct {
	Date     string  `json:"date"`
	Commit   string  `json:"commit"`
	Command  string  `json:"command"`
	Machine  Machine `json:"machine"`
	Reps     int     `json:"reps"`
	Duration string  `json:"duration"`
	Rates    []int   `json:"rates"`
	Cells    []Cell  `json:"cells"`
	// Counts is the counts phase, if it ran.
	Counts *Counts `json:"counts,omitempty"`
	// Scale is the memory, restart and failover phases, if they ran.
	Scale *Scale `json:"scale,omitempty"`
	// OneChange is the Go benchmark of one change's path, if it ran.
	OneChange *GoBench `json:"oneChange,omitempty"`
	// Capacity is each variant's highest sustained rate.
	Capacity []Capacity `json:"capacity,omitempty"`
}

// Capacity is a variant's highest sustained rate (p99 under a second, no
// lost final state, the generator on its schedule): the highest rate of
// the grid it kept up with, narrowed by bisection towards the next.
type Capacity struct {
	Variant string `json:"variant"`
	Rate    int    `json:"rate"`
	// AtTop: it kept up at the grid's highest rate, so Rate is a lower
	// bound.
	AtTop  bool    `json:"atTop,omitempty"`
	Probes []Probe `json:"probes,omitempty"`
}

// Probe is one rate the bisection tried, every repetition of it together.
type Probe struct {
	Rate  int     `json:"rate"`
	Kept  bool    `json:"kept"`
	P99Ms float64 `json:"p99Ms"`
}

func (p Probe) String() string {
	return fmt.Sprintf("%d/s %s (p99 %.0f ms)", p.Rate, map[bool]string{true: "kept up", false: "did not"}[p.Kept], p.P99Ms)
}

// capacityList shows each variant's highest sustained rate.
func capacityList(cs []Capacity) string {
	var b strings.Builder
	b.WriteString("Highest sustained rate (p99 < 1 s, no lost final state, generator kept its schedule):\n\n")
	for _, c := range cs {
		fmt.Fprintf(&b, "- %s: ", c.Variant)
		switch {
		case c.Rate == 0:
			b.WriteString("none of the grid's rates\n")
			continue
		case c.AtTop:
			fmt.Fprintf(&b, "at least %d changes/s (the grid's highest rate)", c.Rate)
		default:
			fmt.Fprintf(&b, "%d changes/s", c.Rate)
		}
		if len(c.Probes) > 0 {
			var ps []string
			for _, p := range c.Probes {
				ps = append(ps, p.String())
			}
			fmt.Fprintf(&b, " (bisected: %s)", strings.Join(ps, ", "))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// Machine is what the run ran on.
type Machine struct {
	CPUs int    `json:"cpus"`
	OS   string `json:"os"`
	Arch string `json:"arch"`
	Go   string `json:"go"`
}

// Cell is one variant at one rate, each repetition as it ran.
type Cell struct {
	Variant string `json:"variant"`
	Rate    int    `json:"rate"`
	Reps    []Rep  `json:"reps"`
}

// Rep is one repetition of a cell (a result, in units a reader can use:
// latencies in milliseconds, CPU in seconds).
type Rep struct {
	Made            int                         `json:"made"`
	Failed          int                         `json:"failed"`
	Covered         int                         `json:"covered"`
	LostFinal       int                         `json:"lostFinal"`
	Unobserved      int                         `json:"unobserved"`
	Duplicates      int                         `json:"duplicates"`
	Events          int                         `json:"events"`
	P50ms           float64                     `json:"p50ms"`
	P99ms           float64                     `json:"p99ms"`
	P999ms          float64                     `json:"p999ms"`
	APICallP99ms    float64                     `json:"apiCallP99ms,omitempty"`
	Behind          bool                        `json:"behind"`
	StudentWrites   int64                       `json:"studentWrites"`
	EventWrites     int64                       `json:"eventWrites"`
	CPUSeconds      float64                     `json:"cpuSeconds"`
	OwnCPUSeconds   float64                     `json:"ownCpuSeconds"`
	ControlPlaneCPU float64                     `json:"controlPlaneCpuSeconds"`
	NATSSent        float64                     `json:"natsMessagesSent"`
	NATSReceived    float64                     `json:"natsMessagesReceived"`
	Drained         float64                     `json:"drainedPerSecond"`
	Applied         int64                       `json:"applied"`
	ReceiptToStatus []float64                   `json:"receiptToStatusMs,omitempty"`
	Stages          map[string]stages.Histogram `json:"stages,omitempty"`
	// Profiles are the bridge processes' profiles (BENCH_PROFILE_DIR).
	Profiles []Profile `json:"profiles,omitempty"`
}

// finite is x, or 0 for what JSON cannot hold (a rate of nothing over no
// time).
func finite(x float64) float64 {
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return 0
	}
	return x
}

func toMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// fromMS undoes toMS exactly (rounded to the nanosecond toMS came from).
func fromMS(ms float64) time.Duration {
	return time.Duration(math.Round(ms * float64(time.Millisecond)))
}

func repOf(r result) Rep {
	rep := Rep{
		Made: r.made, Failed: r.failed, Covered: r.covered, LostFinal: r.lostFinal, Unobserved: r.unobserved,
		Duplicates: r.duplicates, Events: r.events, P50ms: toMS(r.p50), P99ms: toMS(r.p99), P999ms: toMS(r.p999),
		APICallP99ms: toMS(r.apiP99),
		Behind:       r.behind, StudentWrites: r.studentWrites, EventWrites: r.eventWrites, CPUSeconds: finite(r.cpuSeconds),
		OwnCPUSeconds: finite(r.ownCPU), ControlPlaneCPU: finite(r.controlPlaneCPU), NATSSent: r.natsSent, NATSReceived: r.natsReceived,
		Drained: finite(r.drained), Applied: r.applied, Stages: r.stages, Profiles: r.profiles,
	}
	for _, d := range r.receiptToStatus {
		rep.ReceiptToStatus = append(rep.ReceiptToStatus, toMS(d))
	}
	return rep
}

func (rep Rep) result(variant string, rate int) result {
	r := result{
		variant: variant, rate: rate, made: rep.Made, failed: rep.Failed, covered: rep.Covered, lostFinal: rep.LostFinal,
		unobserved: rep.Unobserved, duplicates: rep.Duplicates, events: rep.Events, p50: fromMS(rep.P50ms), p99: fromMS(rep.P99ms),
		p999: fromMS(rep.P999ms), apiP99: fromMS(rep.APICallP99ms), behind: rep.Behind, studentWrites: rep.StudentWrites, eventWrites: rep.EventWrites,
		cpuSeconds: rep.CPUSeconds, ownCPU: rep.OwnCPUSeconds, controlPlaneCPU: rep.ControlPlaneCPU, natsSent: rep.NATSSent,
		natsReceived: rep.NATSReceived, drained: rep.Drained, applied: rep.Applied, stages: rep.Stages, profiles: rep.Profiles,
	}
	for _, ms := range rep.ReceiptToStatus {
		r.receiptToStatus = append(r.receiptToStatus, fromMS(ms))
	}
	return r
}

// newResults is the data of a run with options o and the load phase's
// results, in the order of variants and rates.
func newResults(o options, results map[cellKey][]result) Results {
	res := Results{
		Date:     time.Now().UTC().Format("2006-01-02"),
		Commit:   stack.RepoCommit(),
		Command:  command(os.Args[1:]),
		Machine:  Machine{CPUs: runtime.NumCPU(), OS: runtime.GOOS, Arch: runtime.GOARCH, Go: runtime.Version()},
		Reps:     o.reps,
		Duration: o.duration.String(),
		Rates:    o.rates,
	}
	eachCell(o.rates, results, func(variant) bool { return true }, func(v variant, rate int, rs []result) {
		c := Cell{Variant: v.name, Rate: rate}
		for _, r := range rs {
			c.Reps = append(c.Reps, repOf(r))
		}
		res.Cells = append(res.Cells, c)
	})
	return res
}

// cells are the load phase's results again, by cell.
func (res Results) cells() map[cellKey][]result {
	out := map[cellKey][]result{}
	for _, c := range res.Cells {
		for _, rep := range c.Reps {
			out[cellKey{c.Variant, c.Rate}] = append(out[cellKey{c.Variant, c.Rate}], rep.result(c.Variant, c.Rate))
		}
	}
	return out
}

// command is the command that runs the benchmark with args, as a shell
// takes it (with BENCH_GOMAXPROCS, which changes what it measures).
func command(args []string) string {
	out := []string{"go run ./test/bench"}
	if v := os.Getenv("BENCH_GOMAXPROCS"); v != "" {
		out = append([]string{"BENCH_GOMAXPROCS=" + v}, out...)
	}
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " ()',\"$*") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

// render prints the tables of the results file at path: the load
// phase's, the counts', then the memory, restart and failover phases'.
func render(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var res Results
	if err := json.Unmarshal(b, &res); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return tables(res), nil
}

// tables are the tables of res: the load phase's, the counts', the
// capacities, then the memory, restart and failover phases'.
func tables(res Results) string {
	out := loadTables(res)
	if res.Counts != nil {
		out += "\n" + countsTable(*res.Counts)
	}
	if len(res.Capacity) > 0 {
		out += "\n" + capacityList(res.Capacity)
	}
	if res.Scale != nil {
		out += "\n" + scaleTables(*res.Scale)
	}
	return out
}

// writeResults writes res as JSON to path.
func writeResults(path string, res Results) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
