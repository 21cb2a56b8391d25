package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/student-bridge/student-bridge/internal/soak"
	"github.com/student-bridge/student-bridge/internal/stack"
)

// A rendered block in the docs: every benchmark figure in README.md and
// docs/ stands between such markers, rendered from the committed results
// file the first one names, by the block's kind:
//
//	<!-- bench docs/results/<run>.json summary -->
//	...
//	<!-- end bench -->
//
// A block of kind soak renders a soak's results file (make soak) instead,
// with its plot, which renderDocs draws beside the file (<run>.svg).
//
// `make generate` renders them again (renderDocs); `make verify-gen`
// fails when one differs from what its file renders.
var docBlock = regexp.MustCompile(`(?s)(<!-- bench (\S+) (\S+) -->\n).*?(<!-- end bench -->)`)

// docKinds render a block of each kind from a run's results: the run
// (when, where, the command), the load tables (without the results file's
// title), the summary of the bridge and the references and the bridge's
// ratios to them, the counts, the Go benchmark of one change, the CPU and
// allocation profiles, each variant's highest sustained rate, the memory,
// restart and failover phases, and of those the restart alone.
var docKinds = map[string]func(Results) (string, error){
	"run":     func(res Results) (string, error) { return runLine(res), nil },
	"load":    func(res Results) (string, error) { return strings.TrimPrefix(loadTables(res), loadTitle), nil },
	"summary": func(res Results) (string, error) { t, _ := summaryTables(res); return t, nil },
	"ratios":  func(res Results) (string, error) { _, t := summaryTables(res); return t, nil },
	"counts": func(res Results) (string, error) {
		if res.Counts == nil {
			return "", fmt.Errorf("no counts in this run")
		}
		return countsTable(*res.Counts), nil
	},
	"onechange": func(res Results) (string, error) {
		if res.OneChange == nil {
			return "", fmt.Errorf("no Go benchmark in this run")
		}
		return goBenchTable(*res.OneChange), nil
	},
	"profiles": profileTable,
	"costs":    costTable,
	"capacity": func(res Results) (string, error) {
		if len(res.Capacity) == 0 {
			return "", fmt.Errorf("no capacity in this run (a run with -rates has it)")
		}
		return capacityList(res.Capacity), nil
	},
	"scale": func(res Results) (string, error) {
		if res.Scale == nil {
			return "", fmt.Errorf("no memory, restart and failover phases in this run")
		}
		return scaleTables(*res.Scale), nil
	},
	"restart": func(res Results) (string, error) {
		if res.Scale == nil || len(res.Scale.Counts) == 0 {
			return "", fmt.Errorf("no restart phase in this run")
		}
		return restartTable(*res.Scale), nil
	},
}

// docPaths are the files and folders whose markdown files have benchmark
// blocks, relative to the repository root: README's figures and docs/'s.
var docPaths = []string{"README.md", "docs"}

// docFiles lists the markdown files under paths (files, or folders whose
// *.md files) below root.
func docFiles(root string, paths []string) []string {
	var files []string
	for _, p := range paths {
		p = filepath.Join(root, p)
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			md, _ := filepath.Glob(filepath.Join(p, "*.md"))
			files = append(files, md...)
			continue
		}
		files = append(files, p)
	}
	return files
}

// renderDocs renders every block of the markdown files under paths (see
// docFiles) in place.
func renderDocs(paths []string) error {
	root := stack.RepoRoot()
	for _, f := range docFiles(root, paths) {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		page, _ := filepath.Rel(root, f)
		out, err := renderBlocks(root, filepath.Dir(page), string(b))
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if out != string(b) {
			if err := os.WriteFile(f, []byte(out), 0o644); err != nil {
				return err
			}
		}
	}
	return writeSoakCharts(root)
}

// soakResults is where the soaks' committed results files are: each one's
// plot is drawn beside it.
const soakResults = "docs/results/soak-*.json"

// writeSoakCharts draws the plot of every soak's results file beside it.
func writeSoakCharts(root string) error {
	files, _ := filepath.Glob(filepath.Join(root, soakResults))
	for _, f := range files {
		res, err := loadSoak(f)
		if err != nil {
			return err
		}
		svg, err := soak.Chart(res)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if err := os.WriteFile(strings.TrimSuffix(f, ".json")+".svg", svg, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func loadSoak(file string) (soak.Results, error) {
	var res soak.Results
	b, err := os.ReadFile(file)
	if err == nil {
		err = json.Unmarshal(b, &res)
	}
	return res, err
}

// renderBlocks renders the blocks of one file's text; dir is the file's
// folder relative to root, where its links start.
func renderBlocks(root, dir, text string) (string, error) {
	var errs []error
	loaded := map[string]Results{}
	out := docBlock.ReplaceAllStringFunc(text, func(block string) string {
		m := docBlock.FindStringSubmatch(block)
		if m[3] == "soak" {
			res, err := loadSoak(filepath.Join(root, m[2]))
			if err != nil {
				errs = append(errs, fmt.Errorf("block %s %s: %w", m[2], m[3], err))
				return block
			}
			chart, _ := filepath.Rel(dir, strings.TrimSuffix(m[2], ".json")+".svg")
			return m[1] + strings.TrimSpace(soak.Markdown(res, filepath.ToSlash(chart))) + "\n" + m[4]
		}
		res, ok := loaded[m[2]]
		if !ok {
			b, err := os.ReadFile(filepath.Join(root, m[2]))
			if err == nil {
				err = json.Unmarshal(b, &res)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("block %s %s: %w", m[2], m[3], err))
				return block
			}
			loaded[m[2]] = res
		}
		kind, ok := docKinds[m[3]]
		if !ok {
			errs = append(errs, fmt.Errorf("block %s %s: no such kind", m[2], m[3]))
			return block
		}
		body, err := kind(res)
		if err != nil {
			errs = append(errs, fmt.Errorf("block %s %s: %w", m[2], m[3], err))
			return block
		}
		return m[1] + strings.TrimSpace(body) + "\n" + m[4]
	})
	if len(errs) > 0 {
		return "", errs[0]
	}
	return out, nil
}

// runLine says which run a block's figures come from.
func runLine(res Results) string {
	return fmt.Sprintf("Run of %s (commit %s; %d CPUs, %s/%s, %s): `%s`.", res.Date, res.Commit, res.Machine.CPUs, res.Machine.OS, res.Machine.Arch, res.Machine.Go, res.Command)
}

// summaryVariants are the variants the summary compares, each as a
// process of its own: the two references and the bridge.
var summaryVariants = []string{"raw-informer (process)", "raw-informer (process, acked)", "student-bridge (process)", "student-bridge (3 processes, 16 shards)"}

// summaryTables compare the bridge as a process with the raw informer
// and the acked informer at each rate: p99, its own CPU per change, what
// it drained; median (min-max) of the repetitions, then the bridge's
// ratios to both references.
func summaryTables(res Results) (summary, ratios string) {
	if len(res.Rates) == 0 {
		return "", ""
	}
	results := res.cells()
	var present []string
	for _, v := range summaryVariants {
		if len(results[cellKey{v, res.Rates[0]}]) > 0 {
			present = append(present, v)
		}
	}
	var b strings.Builder
	b.WriteString("| rate/s | quantity | " + strings.Join(present, " | ") + " |\n| --- | --- |" + strings.Repeat(" --- |", len(present)) + "\n")
	quantities := []struct {
		name string
		of   func(r result) float64
		show func(float64) string
	}{
		{"p99 ms", func(r result) float64 { return toMS(r.p99) }, func(x float64) string { return fmt.Sprintf("%.1f", x) }},
		{"p99 ms of the change's API call", func(r result) float64 { return toMS(r.apiP99) }, func(x float64) string { return fmt.Sprintf("%.1f", x) }},
		{"own CPU s/1k changes", ownCPUPerK, func(x float64) string { return fmt.Sprintf("%.2f", x) }},
		{"drained changes/s", func(r result) float64 { return r.drained }, func(x float64) string { return fmt.Sprintf("%.0f", x) }},
	}
	for _, rate := range res.Rates {
		for _, q := range quantities {
			fmt.Fprintf(&b, "| %d | %s |", rate, q.name)
			for _, v := range present {
				lo, med, hi := spanOf(results[cellKey{v, rate}], q.of)
				if med == 0 {
					b.WriteString(" - |") // not measured by the run
					continue
				}
				fmt.Fprintf(&b, " %s (%s-%s) |", q.show(med), q.show(lo), q.show(hi))
			}
			b.WriteString("\n")
		}
	}
	summary = b.String()
	b.Reset()
	b.WriteString("The bridge as a process against the references, median of its repetitions over theirs (and its worst repetition over their median):\n\n")
	b.WriteString("| rate/s | quantity | against the raw informer | against the acked informer |\n| --- | --- | --- | --- |\n")
	bridge := "student-bridge (process)"
	for _, rate := range res.Rates {
		for _, q := range quantities {
			_, med, worst := spanOf(results[cellKey{bridge, rate}], q.of)
			if q.name == "drained changes/s" {
				worst, _, _ = spanOf(results[cellKey{bridge, rate}], q.of)
			}
			fmt.Fprintf(&b, "| %d | %s |", rate, q.name)
			for _, ref := range summaryVariants[:2] {
				_, refMed, _ := spanOf(results[cellKey{ref, rate}], q.of)
				if refMed == 0 || med == 0 {
					b.WriteString(" - |")
					continue
				}
				fmt.Fprintf(&b, " %.2fx (%.2fx) |", med/refMed, worst/refMed)
			}
			b.WriteString("\n")
		}
	}
	return summary, b.String()
}

// costVariants are the variants that each leave something out: what, and
// the variant they leave it out of. An added part (adds) is the other way
// round: the variant has it, of does not.
var costVariants = []struct {
	name, leaves, of string
	adds             bool
}{
	{"student-bridge (process, no finalizer)", "the finalizer: deletes held until published", "student-bridge (process)", false},
	{"student-bridge (process, no k8s Events)", "Kubernetes Events", "student-bridge (process)", false},
	{"student-bridge (process, no status)", "the status view", "student-bridge (process)", false},
	{"student-bridge (process, publishing only)", "all three", "student-bridge (process)", false},
	{"student-bridge (process, one write)", "the reservation's and the record's writes of their own: the record goes in the event's write", "student-bridge (process)", false},
	{"student-bridge (process, publishing only, one write)", "the reservation's and the record's writes of their own", "student-bridge (process, publishing only)", false},
	{"student-bridge (process, compressed)", "nothing, and asks for gzip (kubeAPICompression: true)", "student-bridge (process)", true},
	{"raw-informer (process, acked, uncompressed)", "gzip (client-go's default)", "raw-informer (process, acked)", false},
}

// costTable is what each part of the bridge costs in its own CPU per
// change, at each rate: the bridge as deployed and each variant that
// leaves a part out against the acked informer, and the part's cost, the
// difference from the variant it is left out of (medians of the
// repetitions).
func costTable(res Results) (string, error) {
	const acked, raw, bridge = "raw-informer (process, acked)", "raw-informer (process)", "student-bridge (process)"
	results := res.cells()
	ownCPU := func(v string, rate int) float64 {
		_, med, _ := spanOf(results[cellKey{v, rate}], ownCPUPerK)
		return med
	}
	var b strings.Builder
	b.WriteString("Own CPU per change (ms; the variant's processes only), median of the repetitions, against the acked informer's; a part's cost is the difference from the variant it is left out of:\n\n")
	b.WriteString("| rate/s | variant | leaves out | own CPU ms/change | against the acked informer | the part left out costs, ms/change |\n| --- | --- | --- | --- | --- | --- |\n")
	rows := 0
	for _, rate := range res.Rates {
		ref := ownCPU(acked, rate)
		if ref == 0 || ownCPU(bridge, rate) == 0 {
			continue
		}
		row := func(v, leaves, cost string) {
			if cpu := ownCPU(v, rate); cpu > 0 {
				fmt.Fprintf(&b, "| %d | %s | %s | %.3f | %.2fx | %s |\n", rate, v, leaves, cpu, cpu/ref, cost)
				rows++
			}
		}
		row(raw, "waiting for the ack", fmt.Sprintf("%.3f", ref-ownCPU(raw, rate)))
		row(acked, "everything of the bridge's", "-")
		row(bridge, "nothing (as deployed)", "-")
		for _, c := range costVariants {
			of := ownCPU(c.of, rate)
			switch {
			case of == 0:
			case c.adds:
				row(c.name, c.leaves, fmt.Sprintf("%.3f (added to %s)", ownCPU(c.name, rate)-of, c.of))
			default:
				row(c.name, c.leaves, fmt.Sprintf("%.3f (of %s)", of-ownCPU(c.name, rate), c.of))
			}
		}
	}
	if rows == 0 {
		return "", fmt.Errorf("no cell of the acked informer and the bridge as a process in this run")
	}
	return b.String(), nil
}

// ownCPUPerK is r's own CPU (its variant's processes) in seconds per
// 1,000 changes: milliseconds per change.
func ownCPUPerK(r result) float64 { return r.ownCPU / float64(r.made) * 1000 }

// spanOf is the lowest, median and highest of of over rs (0s without rs).
func spanOf(rs []result, of func(result) float64) (lo, med, hi float64) {
	if len(rs) == 0 {
		return 0, 0, 0
	}
	d := make([]float64, len(rs))
	for i, r := range rs {
		d[i] = of(r)
	}
	slices.Sort(d)
	return d[0], d[len(d)/2], d[len(d)-1]
}

// spanText shows of over rs as its median (min-max), with two decimals.
func spanText(rs []result, of func(result) float64) string {
	lo, med, hi := spanOf(rs, of)
	return fmt.Sprintf("%.2f (%.2f-%.2f)", med, lo, hi)
}
