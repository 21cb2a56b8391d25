package main

import (
	"bufio"
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/student-bridge/student-bridge/internal/stack"
)

// The Go benchmark of one change's path inside the bridge (reconciler
// BenchmarkOneChange: the Student from the cache, its reservation, the
// publish and its ack, the record), run as its own test binary before the
// process-level phases, so the machine is quiet for it.
const (
	goBenchPackage = "./reconciler"
	goBenchName    = "BenchmarkOneChange"
	goBenchTime    = "3s"
)

// GoBench is the Go benchmark's figures: each unit it reports (ns/op,
// B/op, allocs/op, the stages' ns/op, ...) with its value in every run.
type GoBench struct {
	Name    string               `json:"name"`
	Command string               `json:"command"`
	Units   map[string][]float64 `json:"units"`
}

// goBench runs the Go benchmark count times and collects what it reports.
func goBench(count int) (GoBench, error) {
	args := []string{"test", "-run", "^$", "-bench", "^" + goBenchName + "$", "-benchmem",
		"-benchtime", goBenchTime, "-count", strconv.Itoa(count), goBenchPackage}
	assets, err := stack.AssetsDir("")
	if err != nil {
		return GoBench{}, err
	}
	cmd := stack.GoCommand(args[0], args[1:]...)
	cmd.Env = append(cmd.Env, "KUBEBUILDER_ASSETS="+assets)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return GoBench{}, fmt.Errorf("go %s: %w\n%s%s", strings.Join(args, " "), err, out.String(), stderr.String())
	}
	g := GoBench{Name: goBenchName, Command: "go " + strings.Join(cmd.Args[1:], " "), Units: map[string][]float64{}}
	if err := parseGoBench(out.String(), &g); err != nil {
		return GoBench{}, err
	}
	return g, nil
}

// parseGoBench reads the result lines of the benchmark g names: the
// iterations, then value and unit pairs.
func parseGoBench(out string, g *GoBench) error {
	s := bufio.NewScanner(strings.NewReader(out))
	runs := 0
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) < 4 || (f[0] != g.Name && !strings.HasPrefix(f[0], g.Name+"-")) {
			continue
		}
		runs++
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return fmt.Errorf("%s: %q is no value", g.Name, f[i])
			}
			g.Units[f[i+1]] = append(g.Units[f[i+1]], v)
		}
	}
	if runs == 0 {
		return fmt.Errorf("%s reported nothing:\n%s", g.Name, out)
	}
	return nil
}

// goBenchUnits are the units the table shows, in its order, with what
// each is; a unit not listed is shown after them.
var goBenchUnits = []struct{ unit, what string }{
	{"ns/op", "time per change"},
	{"cpu-ns/op", "the process's CPU time per change (the NATS server runs in another)"},
	{"write_ahead-ns/op", "the reservation (its record written as pending)"},
	{"publish-ns/op", "the publish, to JetStream's ack"},
	{"record-ns/op", "the record written after the ack"},
	{"allocs/op", "allocations per change"},
	{"B/op", "bytes allocated per change"},
	{"goroutines/op", "goroutines started per change"},
	{"ctxsw/op", "the process's context switches per change"},
}

// goBenchTable renders g: the median (the upper one of an even count) and
// the min-max of each unit over the runs.
func goBenchTable(g GoBench) string {
	var b strings.Builder
	fmt.Fprintf(&b, "`%s`, %d runs of %s each; median (min-max).\n\n", g.Command, len(g.Units["ns/op"]), goBenchTime)
	b.WriteString("| per change | median (min-max) | what |\n| --- | --- | --- |\n")
	shown := map[string]bool{}
	row := func(unit, what string) {
		vs := slices.Clone(g.Units[unit])
		if len(vs) == 0 {
			return
		}
		shown[unit] = true
		slices.Sort(vs)
		f := func(v float64) string { return strconv.FormatFloat(v, 'g', 3, 64) } // counts below one a change
		if v := vs[len(vs)-1]; v >= 100 {
			f = func(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }
		}
		fmt.Fprintf(&b, "| %s | %s (%s-%s) | %s |\n", unit, f(vs[len(vs)/2]), f(vs[0]), f(vs[len(vs)-1]), what)
	}
	for _, u := range goBenchUnits {
		row(u.unit, u.what)
	}
	var rest []string
	for u := range g.Units {
		if !shown[u] {
			rest = append(rest, u)
		}
	}
	slices.Sort(rest)
	for _, u := range rest {
		row(u, "")
	}
	return b.String()
}
