// Command compat is the compatibility tier (make test-compat): it runs, on
// each supported Kubernetes version, the tests of what a version can break
// (the CRD and its validation, the tutorial's story, the overlays and the
// chart applied server-side, the finalizer with and without the policy,
// shard Leases handed over, verify), each against that version's
// kube-apiserver, and writes what passed to a results file. With -docs it
// renders that file into the support table of docs/deploy.md instead:
//
//	<!-- compat docs/results/compat.json -->
//	...
//	<!-- end compat -->
//
// `make generate` renders it; `make verify-gen` fails when it is stale.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/student-bridge/student-bridge/internal/stack"
)

// A check is one column of the support table: tests of one package that
// prove one thing on a version.
type check struct {
	Name string
	Pkg  string
	Run  string
}

// checks are what a Kubernetes version can break, in the table's order.
var checks = []check{
	{"CRD, validation, columns", "./api/v1", ""},
	{"tutorial story", "./internal/bridge", "^TestLifecycle$"},
	{"overlays and chart, server-side", "./deploy", "^(TestOverlaysApplyServerSide|TestPodsMeetRestrictedPodSecurity|TestChartInstallUpgradeUninstall)$"},
	{"finalizer by the bridge", "./reconciler", "^(TestLifecycle|TestDeletedWithoutFinalizer|TestFailedPublishHoldsTheDelete)$"},
	{"finalizer policy", "./test/e2e", "^TestFinalizerPolicy$"},
	{"shard Leases", "./internal/shards", ""},
	{"verify", "./internal/bridge", "^TestVerifyFindsEachKindOfDrift$"},
}

// Results is the results file.
type Results struct {
	// Date and Commit name the run; Command is how it was made.
	Date    string `json:"date"`
	Commit  string `json:"commit"`
	Command string `json:"command"`
	// Versions are the runs, oldest Kubernetes first.
	Versions []Version `json:"versions"`
}

// Version is one Kubernetes version's run.
type Version struct {
	// Version is what its kube-apiserver --version printed.
	Version string        `json:"version"`
	Checks  []CheckResult `json:"checks"`
	// Seconds is how long its checks took, compiles included.
	Seconds float64 `json:"seconds"`
}

// CheckResult is one check's outcome on one version.
type CheckResult struct {
	Name string `json:"name"`
	// Result is pass, fail, or "not served" where every test of the check
	// skipped because the version serves no API it needs.
	Result string `json:"result"`
	// Tests are the top-level tests and their outcomes.
	Tests map[string]string `json:"tests"`
	// Note is a skip's reason.
	Note string `json:"note,omitempty"`
}

func main() {
	assets := flag.String("assets", "", "comma-separated version=dir pairs: each dir holds a kube-apiserver, etcd and kubectl (e.g. 1.34=bin/kube-1.34,1.37=bin)")
	out := flag.String("out", "docs/results/compat.json", "the results file to write")
	docs := flag.Bool("docs", false, "render the support table of docs/deploy.md from -out instead of running")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: go run ./hack/compat -assets 1.34=DIR,... [-out FILE]\n       go run ./hack/compat -docs\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	var err error
	if *docs {
		err = renderDocs(*out, "docs/deploy.md")
	} else {
		err = run(*assets, *out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "compat:", err)
		os.Exit(1)
	}
}

func run(assets, out string) error {
	if assets == "" {
		return errors.New("-assets is required")
	}
	root := stack.RepoRoot()
	res := Results{
		Date:    time.Now().UTC().Format("2006-01-02"),
		Commit:  stack.RepoCommit(),
		Command: "go run ./hack/compat " + strings.Join(os.Args[1:], " "),
	}
	failed := false
	for _, pair := range strings.Split(assets, ",") {
		_, dir, ok := strings.Cut(pair, "=")
		if !ok {
			return fmt.Errorf("-assets: %q is not version=dir", pair)
		}
		dir, err := filepath.Abs(dir)
		if err != nil {
			return err
		}
		_, full, err := stack.APIServerVersion(dir)
		if err != nil {
			return err
		}
		v := Version{Version: full}
		began := time.Now()
		for _, c := range checks {
			fmt.Printf("=== %s: %s (%s %s)\n", full, c.Name, c.Pkg, c.Run)
			r, err := runCheck(root, dir, c)
			if err != nil {
				return err
			}
			fmt.Printf("--- %s: %s: %s %s\n", full, c.Name, r.Result, r.Note)
			failed = failed || r.Result == "fail"
			v.Checks = append(v.Checks, r)
		}
		v.Seconds = time.Since(began).Round(time.Second).Seconds()
		res.Versions = append(res.Versions, v)
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, out), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if failed {
		return fmt.Errorf("a check failed on some version: see %s", out)
	}
	return nil
}

// event is a line of go test -json.
type event struct {
	Action string
	Test   string
	Output string
}

// runCheck runs c's tests against the kube-apiserver in dir and reads
// their outcomes.
func runCheck(root, dir string, c check) (CheckResult, error) {
	// Built as make builds the programs it runs (stack.GoCommand), so the
	// versions' runs share one compile.
	args := []string{"-count=1", "-json", "-timeout", "20m", c.Pkg}
	if c.Run != "" {
		args = append(args, "-run", c.Run)
	}
	cmd := stack.GoCommand("test", args...)
	cmd.Dir = root
	cmd.Env = append(cmd.Env, "KUBEBUILDER_ASSETS="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return CheckResult{}, err
	}
	if err := cmd.Start(); err != nil {
		return CheckResult{}, err
	}
	r := CheckResult{Name: c.Name, Tests: map[string]string{}}
	output := map[string]*strings.Builder{}
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test == "" || strings.Contains(e.Test, "/") {
			continue
		}
		switch e.Action {
		case "output":
			if output[e.Test] == nil {
				output[e.Test] = &strings.Builder{}
			}
			output[e.Test].WriteString(e.Output)
		case "pass", "fail", "skip":
			r.Tests[e.Test] = e.Action
		}
	}
	waitErr := cmd.Wait()
	if _, err := io.Copy(os.Stderr, &stderr); err != nil {
		return r, err
	}
	var passed, skipped, failed []string
	for name, result := range r.Tests {
		switch result {
		case "pass":
			passed = append(passed, name)
		case "skip":
			skipped = append(skipped, name)
		default:
			failed = append(failed, name)
		}
	}
	sort.Strings(failed)
	for _, name := range failed {
		if o := output[name]; o != nil {
			fmt.Print(o.String())
		}
	}
	switch {
	case waitErr != nil || len(failed) > 0 || len(r.Tests) == 0:
		r.Result = "fail"
		if len(r.Tests) == 0 {
			r.Note = fmt.Sprintf("no test ran (%v)", waitErr)
		}
	case len(passed) == 0:
		// Only skips: the version lacks what the check needs, and the
		// tests said so (stacktest.RequireFinalizerPolicy).
		r.Result = "not served"
		r.Note = skipReason(output[skipped[0]])
		if r.Note == "" {
			r.Result, r.Note = "fail", "skipped without saying why"
		}
	default:
		r.Result = "pass"
	}
	return r, nil
}

var notServed = regexp.MustCompile(`not served: (.*)`)

// skipReason is the "not served: ..." line a skipped test printed.
func skipReason(o *strings.Builder) string {
	if o == nil {
		return ""
	}
	m := notServed.FindStringSubmatch(o.String())
	if m == nil {
		return ""
	}
	return strings.TrimSpace(m[1])
}

var docBlock = regexp.MustCompile(`(?s)(<!-- compat (\S+) -->\n).*?(<!-- end compat -->)`)

// renderDocs renders the support table of page from the results file its
// block names (file is the default for a block that names none).
func renderDocs(file, page string) error {
	root := stack.RepoRoot()
	p := filepath.Join(root, page)
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	var renderErr error
	found := false
	out := docBlock.ReplaceAllStringFunc(string(b), func(block string) string {
		found = true
		m := docBlock.FindStringSubmatch(block)
		table, err := renderTable(filepath.Join(root, m[2]))
		if err != nil {
			renderErr = fmt.Errorf("%s: %w", page, err)
			return block
		}
		return m[1] + table + m[3]
	})
	if renderErr != nil {
		return renderErr
	}
	if !found {
		return fmt.Errorf("%s has no <!-- compat %s --> block", page, file)
	}
	if out != string(b) {
		return os.WriteFile(p, []byte(out), 0o644)
	}
	return nil
}

// renderTable is the support table: a row per version, a column per check.
func renderTable(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	var res Results
	if err := json.Unmarshal(b, &res); err != nil {
		return "", fmt.Errorf("%s: %w", file, err)
	}
	var sb strings.Builder
	sb.WriteString("| Kubernetes |")
	for _, c := range checks {
		sb.WriteString(" " + c.Name + " |")
	}
	sb.WriteString("\n| --- |" + strings.Repeat(" --- |", len(checks)) + "\n")
	var notes []string
	for _, v := range res.Versions {
		byName := map[string]CheckResult{}
		for _, c := range v.Checks {
			byName[c.Name] = c
		}
		sb.WriteString("| " + v.Version + " |")
		for _, c := range checks {
			r, ok := byName[c.Name]
			cell := "not run"
			if ok {
				cell = r.Result
			}
			if r.Note != "" {
				notes = append(notes, fmt.Sprintf("%s, %s: %s", v.Version, c.Name, r.Note))
			}
			sb.WriteString(" " + cell + " |")
		}
		sb.WriteString("\n")
	}
	fmt.Fprintf(&sb, "\nRun on %s at `%s`: `%s` (`make test-compat`).", res.Date, res.Commit, res.Command)
	var took []string
	for _, v := range res.Versions {
		took = append(took, fmt.Sprintf("%s %.0f s", v.Version, v.Seconds))
	}
	fmt.Fprintf(&sb, " The checks took %s (compiles included, the kube-apiservers built before).\n", strings.Join(took, ", "))
	for _, n := range notes {
		sb.WriteString("\n- " + n)
	}
	if len(notes) > 0 {
		sb.WriteString("\n")
	}
	return sb.String(), nil
}
