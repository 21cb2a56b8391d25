// Command timings measures how long the Makefile's entry points take on
// this machine, and renders the table of docs/development.md from what it
// measured:
//
//	go run ./hack/timings -name "make test-unit" -state warm -- make test-unit
//	go run ./hack/timings -docs
//
// Each measurement replaces the one of the same name and state in
// docs/results/timings.json, with the date, the commit and the machine's
// CPUs. "cold" is with an empty Go build cache (GOCACHE set to a new
// directory: every tool and package compiled from nothing; the module
// cache is kept, so nothing is downloaded), "warm" with the build cache
// and bin/ of an earlier run. A command that starts a server and keeps
// running is measured to a line it prints (-until).
//
// The table stands between these markers:
//
//	<!-- timings docs/results/timings.json -->
//	...
//	<!-- end timings -->
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/student-bridge/student-bridge/internal/stack"
)

// Timing is one measurement.
type Timing struct {
	Name    string  `json:"name"`
	State   string  `json:"state"`
	Command string  `json:"command"`
	Seconds float64 `json:"seconds"`
	Date    string  `json:"date"`
	Commit  string  `json:"commit"`
	CPUs    int     `json:"cpus"`
	// Note says what the figure includes, e.g. where -until stopped it.
	Note string `json:"note,omitempty"`
	// Packages are the times go test printed for each package it tested
	// (its "ok" lines), where the command ran go test.
	Packages map[string]float64 `json:"packages,omitempty"`
}

// tiers are docs/development.md's tiers: what a package's tests start.
var tiers = []struct {
	name string
	pkgs []string
}{
	{"nothing", []string{"api/contract", "internal/queue", "internal/records", "internal/config", "internal/stages", "internal/soak", "internal/contractgen", "internal/publicapi", "cmd/student-bridge"}},
	{"NATS", []string{"internal/natssink", "internal/natsconn", "internal/tail", "internal/verify", "internal/fleet", "consumer"}},
	{"API server", []string{"api/v1", "reconciler", "internal/statusview", "internal/kubeevents", "internal/shards", "internal/bridge", "internal/stack", "deploy", "examples/roster"}},
	{"processes", []string{"test/e2e", "test/bench", "test/node"}},
}

// formerly names the packages that moved, by their place in the runs
// recorded before the move.
var formerly = map[string]string{
	"internal/queue":      "reconciler/queue",
	"internal/records":    "reconciler/records",
	"internal/statusview": "reconciler/statusview",
	"internal/natssink":   "sink/natssink",
}

var okLine = regexp.MustCompile(`^ok\s+github\.com/student-bridge/student-bridge/(\S+)\s+([0-9.]+)s`)

const file = "docs/results/timings.json"

func main() {
	name := flag.String("name", "", "what is measured, as the table names it (e.g. \"make run\")")
	state := flag.String("state", "warm", "cold (an empty Go build cache) or warm")
	until := flag.String("until", "", "stop the command once its output has a line containing this, and measure to it")
	note := flag.String("note", "", "what the figure includes")
	dir := flag.String("dir", "", "run the command in this directory (e.g. a fresh clone, for a cold bin/); default the repository")
	docs := flag.Bool("docs", false, "render the table of docs/development.md instead of measuring")
	flag.Parse()
	var err error
	if *docs {
		err = render("docs/development.md")
	} else {
		err = measure(*name, *state, *until, *note, *dir, flag.Args())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "timings:", err)
		os.Exit(1)
	}
}

func measure(name, state, until, note, dir string, args []string) error {
	if name == "" || len(args) == 0 {
		return errors.New("usage: timings -name NAME [-state cold|warm] [-until LINE] -- COMMAND")
	}
	if state != "cold" && state != "warm" {
		return fmt.Errorf("-state %q: cold or warm", state)
	}
	root := stack.RepoRoot()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = root
	if dir != "" {
		cmd.Dir = dir
	}
	cmd.Env = os.Environ()
	if state == "cold" {
		cache, err := os.MkdirTemp("", "timings-gocache-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(cache)
		cmd.Env = append(cmd.Env, "GOCACHE="+cache)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The commit measured is the one the command runs on, as it was
	// before it ran.
	commit := stack.CommitAt(cmd.Dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = cmd.Stdout
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	reached := false
	packages := map[string]float64{}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		fmt.Println(sc.Text())
		if m := okLine.FindStringSubmatch(sc.Text()); m != nil {
			var secs float64
			if _, err := fmt.Sscan(m[2], &secs); err == nil {
				packages[m[1]] = secs
			}
		}
		if until != "" && strings.Contains(sc.Text(), until) {
			reached = true
			break
		}
	}
	took := time.Since(began)
	if reached {
		// The whole group: make and what it started.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
		go func() { _, _ = io.Copy(io.Discard, out) }()
		_ = cmd.Wait()
	} else if err := cmd.Wait(); err != nil {
		return fmt.Errorf("%s: %w", strings.Join(args, " "), err)
	} else if until != "" {
		return fmt.Errorf("%s ended without printing %q", strings.Join(args, " "), until)
	}
	t := Timing{Name: name, State: state, Command: strings.Join(args, " "), Seconds: took.Round(time.Second).Seconds(),
		Date: began.UTC().Format("2006-01-02"), Commit: commit, CPUs: runtime.NumCPU(), Note: note}
	if len(packages) > 0 {
		t.Packages = packages
	}
	var all []Timing
	if b, err := os.ReadFile(filepath.Join(root, file)); err == nil {
		if err := json.Unmarshal(b, &all); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
	}
	all = slices.DeleteFunc(all, func(o Timing) bool { return o.Name == name && o.State == state })
	all = append(all, t)
	slices.SortStableFunc(all, func(a, b Timing) int { return strings.Compare(a.Name+a.State, b.Name+b.State) })
	b, err := json.MarshalIndent(all, "", "  ")
	if err != nil {
		return err
	}
	fmt.Printf("timings: %s (%s) took %.0f s\n", name, state, t.Seconds)
	return os.WriteFile(filepath.Join(root, file), append(b, '\n'), 0o644)
}

var block = regexp.MustCompile(`(?s)(<!-- timings (\S+) -->\n).*?(<!-- end timings -->)`)

func render(page string) error {
	root := stack.RepoRoot()
	p := filepath.Join(root, page)
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	m := block.FindStringSubmatch(string(b))
	if m == nil {
		return fmt.Errorf("%s has no <!-- timings %s --> block", page, file)
	}
	rb, err := os.ReadFile(filepath.Join(root, m[2]))
	if err != nil {
		return err
	}
	var all []Timing
	if err := json.Unmarshal(rb, &all); err != nil {
		return fmt.Errorf("%s: %w", m[2], err)
	}
	var sb strings.Builder
	sb.WriteString("| entry point | state | time | what it includes | measured |\n| --- | --- | --- | --- | --- |\n")
	for _, t := range all {
		fmt.Fprintf(&sb, "| `%s` | %s | %s | %s | %s at `%s`, %d CPUs |\n", t.Name, t.State, duration(t.Seconds), t.Note, t.Date, t.Commit, t.CPUs)
	}
	for _, t := range all {
		// The tiers of the whole suite only; a narrower run has them too.
		if t.Name != "make test" || len(t.Packages) == 0 {
			continue
		}
		fmt.Fprintf(&sb, "\nIn `%s` (%s, %s at `%s`), the tiers' packages took (each package's time as go test printed it; two run at once):\n\n", t.Name, t.State, t.Date, t.Commit)
		sb.WriteString("| tier | packages' time | slowest package |\n| --- | --- | --- |\n")
		for _, tier := range tiers {
			sum, slowest, slowestName := 0.0, 0.0, ""
			for _, p := range tier.pkgs {
				took := t.Packages[p] + t.Packages[formerly[p]]
				sum += took
				if took > slowest {
					slowest, slowestName = took, p
				}
			}
			cell := "not run"
			if slowestName != "" {
				cell = fmt.Sprintf("`%s`, %s", slowestName, duration(slowest))
			}
			fmt.Fprintf(&sb, "| %s | %s | %s |\n", tier.name, duration(sum), cell)
		}
	}
	out := strings.Replace(string(b), m[0], m[1]+sb.String()+m[3], 1)
	if out != string(b) {
		return os.WriteFile(p, []byte(out), 0o644)
	}
	return nil
}

// duration is s as minutes and seconds.
func duration(s float64) string {
	d := time.Duration(s) * time.Second
	if d < time.Minute {
		return fmt.Sprintf("%d s", int(d.Seconds()))
	}
	return fmt.Sprintf("%d min %02d s", int(d.Minutes()), int(d.Seconds())%60)
}
