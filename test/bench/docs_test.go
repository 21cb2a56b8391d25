package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/student-bridge/student-bridge/internal/stack"
)

// A block is rendered again from its results file, whatever it held; a
// block of a kind or a file that does not exist is an error.
func TestRenderBlocks(t *testing.T) {
	root := t.TempDir()
	res := Results{Date: "2026-12-03", Commit: "abc", Command: "bench -rates 100", Machine: Machine{CPUs: 2, OS: "linux", Arch: "amd64", Go: "go1.26.8"}}
	if err := writeResults(filepath.Join(root, "run.json"), res); err != nil {
		t.Fatal(err)
	}
	text := "before\n<!-- bench run.json run -->\nan old figure: 2.4x\n<!-- end bench -->\nafter\n"
	out, err := renderBlocks(root, "", text)
	if err != nil {
		t.Fatal(err)
	}
	want := "before\n<!-- bench run.json run -->\n" + runLine(res) + "\n<!-- end bench -->\nafter\n"
	if out != want {
		t.Errorf("rendered\n%s\nwant\n%s", out, want)
	}
	if again, err := renderBlocks(root, "", out); err != nil || again != out {
		t.Errorf("rendering twice changed the text: %v\n%s", err, again)
	}
	for _, bad := range []string{"<!-- bench run.json nothing -->\n<!-- end bench -->", "<!-- bench gone.json run -->\n<!-- end bench -->", "<!-- bench run.json counts -->\n<!-- end bench -->",
		"<!-- bench run.json restart -->\n<!-- end bench -->"} {
		if _, err := renderBlocks(root, "", bad); err == nil {
			t.Errorf("%q rendered without an error", bad)
		}
	}
	if !strings.Contains(runLine(res), "`bench -rates 100`") {
		t.Errorf("the run line does not give the command: %s", runLine(res))
	}
	_ = os.Remove(filepath.Join(root, "run.json"))
}

// A capacity names its bisection's probes, and a rate that was the grid's
// top as a lower bound.
func TestCapacityList(t *testing.T) {
	got := capacityList([]Capacity{
		{Variant: "a", Rate: 550, Probes: []Probe{{Rate: 550, Kept: true, P99Ms: 40}, {Rate: 775, P99Ms: 1800}}},
		{Variant: "b", Rate: 1000, AtTop: true},
		{Variant: "c"},
	})
	for _, want := range []string{"- a: 550 changes/s (bisected: 550/s kept up (p99 40 ms), 775/s did not (p99 1800 ms))\n", "- b: at least 1000 changes/s (the grid's highest rate)\n", "- c: none of the grid's rates\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("capacity list\n%s\nwithout %q", got, want)
		}
	}
}

func TestCommandQuotesForAShell(t *testing.T) {
	got := command([]string{"-rates", "100,1000", "-students", "", "-only", "=raw-informer (process),=it's"})
	want := `go run ./test/bench -rates '100,1000' -students '' -only '=raw-informer (process),=it'\''s'`
	if got != want {
		t.Errorf("command = %s, want %s", got, want)
	}
}

// TestEveryBlockIsRendered: every markdown file of the repository with a
// benchmark block is one `-docs` (make generate) renders, so make
// verify-gen sees its figures drift, and each is as its results file
// renders it now.
func TestEveryBlockIsRendered(t *testing.T) {
	root := stack.RepoRoot()
	rendered := map[string]bool{}
	for _, f := range docFiles(root, docPaths) {
		rendered[f] = true
	}
	found := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".md") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil || !docBlock.Match(b) {
			return err
		}
		found++
		rel, _ := filepath.Rel(root, path)
		if !rendered[path] {
			t.Errorf("%s has benchmark blocks that -docs (make generate) does not render", rel)
			return nil
		}
		if out, err := renderBlocks(root, filepath.Dir(rel), string(b)); err != nil || out != string(b) {
			t.Errorf("%s's benchmark blocks are not as their results files render them (make generate): %v", rel, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Fatal("no markdown file with a benchmark block found")
	}
}

// A part's cost is the variant it is left out of less the variant
// without it, and each variant is read against the acked informer of its
// rate.
func TestCostTable(t *testing.T) {
	cell := func(v string, ownCPU float64) Cell {
		return Cell{Variant: v, Rate: 100, Reps: []Rep{{Made: 1000, OwnCPUSeconds: ownCPU}}}
	}
	res := Results{Rates: []int{100}, Cells: []Cell{
		cell("raw-informer (process)", 0.5), cell("raw-informer (process, acked)", 0.6), cell("student-bridge (process)", 1.5),
		cell("student-bridge (process, publishing only)", 1.2), cell("student-bridge (process, publishing only, one write)", 0.9),
	}}
	got, err := costTable(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| 100 | raw-informer (process) | waiting for the ack | 0.500 | 0.83x | 0.100 |",
		"| 100 | student-bridge (process) | nothing (as deployed) | 1.500 | 2.50x | - |",
		"| 100 | student-bridge (process, publishing only) | all three | 1.200 | 2.00x | 0.300 (of student-bridge (process)) |",
		"| 100 | student-bridge (process, publishing only, one write) | the reservation's and the record's writes of their own | 0.900 | 1.50x | 0.300 (of student-bridge (process, publishing only)) |",
	} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("cost table\n%s\nwithout %q", got, want)
		}
	}
	if strings.Contains(got, "no k8s Events") {
		t.Errorf("cost table shows a variant the run did not measure:\n%s", got)
	}
	if _, err := costTable(Results{Rates: []int{100}}); err == nil {
		t.Error("a run without the bridge and the acked informer rendered a cost table")
	}
}
