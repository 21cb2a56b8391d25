package e2e

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode"

	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// TestREADMECommands runs the commands of the README and of docs/, so they
// cannot drift from the code: every `bin/kubectl` line of their sh blocks,
// in order, against `student-bridge dev` (`kubectl edit` with an editor that
// makes the README's edit), and every `bin/student-bridge` line with --help
// appended, which fails on an unknown command or flag. `kubectl get stu`
// must print the columns the page shows.
func TestREADMECommands(t *testing.T) {
	lines := readmeCommands(t)
	dir := t.TempDir()
	natsPort := stacktest.FreePorts(t, 1)
	p := start(t, dir, "dev", "--dir", dir, "--nats-port", fmt.Sprint(natsPort), "--metrics-bind-address", "0", "--health-probe-bind-address", "0")
	p.waitOutput(t, "stream ready", 90*time.Second)
	kubeconfig := filepath.Join(dir, "kubeconfig")

	// The README's edit: spec.school to tsinghua.
	editor := filepath.Join(t.TempDir(), "editor.sh")
	if err := os.WriteFile(editor, []byte("#!/bin/sh\nsed -i 's/school: china/school: tsinghua/' \"$1\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ran := map[string]int{}
	for _, l := range lines {
		args := strings.Fields(l.cmd)
		var name string
		var env []string
		switch args[0] {
		case "bin/kubectl":
			name, args = filepath.Join(assets, "kubectl"), args[1:]
			env = []string{"KUBECONFIG=" + kubeconfig, "KUBE_EDITOR=" + editor}
		case "bin/student-bridge":
			name, args = binary, append(args[1:], "--help")
		default:
			continue
		}
		var out []byte
		// Retried briefly: the bridge publishes and writes status after the
		// fact, and kubectl edit conflicts with a status write.
		err := stacktest.Eventually(30*time.Second, func() error {
			cmd := exec.Command(name, args...)
			cmd.Dir = stack.RepoRoot()
			cmd.Env = append(os.Environ(), env...)
			var err error
			if out, err = cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("%v\n%s", err, out)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s line %d: %s: %v", l.file, l.line, l.cmd, err)
		}
		ran[strings.Fields(l.cmd)[0]]++
		if strings.HasPrefix(l.cmd, "bin/kubectl get stu") {
			checkColumns(t, l, string(out))
		}
	}
	if ran["bin/kubectl"] < 5 || ran["bin/student-bridge"] < 3 {
		t.Errorf("ran %v: the docs' sh blocks were not found", ran)
	}
	if err := p.stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("dev exited with %v", err)
	}
}

type readmeLine struct {
	file string // README.md or docs/<page>.md
	line int
	cmd  string
	// header is the table the README shows below the command, if any.
	header string
}

// readmeCommands returns the lines of the sh blocks of the README and then
// of every page of docs/ (in name order), comments cut.
func readmeCommands(t *testing.T) []readmeLine {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(stack.RepoRoot(), "docs", "*.md"))
	if err != nil || len(pages) == 0 {
		t.Fatalf("no pages in docs/: %v", err)
	}
	var out []readmeLine
	for _, path := range append([]string{filepath.Join(stack.RepoRoot(), "README.md")}, pages...) {
		out = append(out, shLines(t, path)...)
	}
	return out
}

// shLines returns the lines of the sh blocks of one Markdown file.
func shLines(t *testing.T, path string) []readmeLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	file, _ := filepath.Rel(stack.RepoRoot(), path)
	var out []readmeLine
	in := false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		text := sc.Text()
		switch {
		case strings.HasPrefix(text, "```sh"):
			in = true
		case strings.HasPrefix(text, "```"):
			in = false
		case in && strings.HasPrefix(text, "# NAME") && len(out) > 0:
			out[len(out)-1].header = strings.Join(strings.Fields(strings.TrimPrefix(text, "#")), " ")
		case in && strings.TrimSpace(text) != "" && !strings.HasPrefix(text, "#"):
			cmd, _, _ := strings.Cut(text, "#")
			out = append(out, readmeLine{file: file, line: n, cmd: strings.TrimSpace(cmd)})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func checkColumns(t *testing.T, l readmeLine, out string) {
	t.Helper()
	if l.header == "" {
		return
	}
	first, _, _ := strings.Cut(out, "\n")
	if got := strings.Join(strings.Fields(first), " "); got != l.header {
		t.Errorf("%s line %d: %s prints columns %q, the page shows %q", l.file, l.line, l.cmd, got, l.header)
	}
}

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile("(?m)^#+ (.+)$")
)

// TestDocsLinks: every relative link of the README and of docs/ names a
// file that exists, and a #section of it that is a heading there (as
// GitHub makes anchors of headings).
func TestDocsLinks(t *testing.T) {
	root := stack.RepoRoot()
	pages, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	for _, page := range append([]string{filepath.Join(root, "README.md")}, pages...) {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(root, page)
		for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
			}
			linked, err := os.ReadFile(path)
			if err != nil {
				t.Errorf("%s links %s: %v", name, target, err)
				continue
			}
			if anchor != "" && !slices.Contains(anchors(string(linked)), anchor) {
				t.Errorf("%s links %s: no such heading in %s (%v)", name, target, file, anchors(string(linked)))
			}
		}
	}
}

// anchors are the GitHub anchors of a Markdown file's headings.
func anchors(md string) []string {
	var out []string
	for _, m := range mdHeading.FindAllStringSubmatch(md, -1) {
		a := strings.Map(func(r rune) rune {
			switch {
			case r == ' ':
				return '-'
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				return unicode.ToLower(r)
			}
			return -1
		}, m[1])
		out = append(out, a)
	}
	return out
}

// TestLayoutNamesEveryPackage: the layout table of docs/architecture.md
// names every directory of Go code by its path, so a package added
// without a word of what it holds fails. A tool module (a go.mod of its
// own) is named by its root, which covers its directories.
func TestLayoutNamesEveryPackage(t *testing.T) {
	root := stack.RepoRoot()
	b, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, _ := strings.Cut(string(b), "## Layout")
	named := map[string]bool{}
	for line := range strings.Lines(table) {
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(first, -1) {
			named[m[1]] = true
		}
	}
	var modules []string // the roots of the tool modules
	dirs := map[string]bool{}
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" || rel == "bin") {
			return filepath.SkipDir
		}
		switch dir := filepath.Dir(rel); {
		case dir == ".":
		case d.Name() == "go.mod":
			modules = append(modules, dir)
		case strings.HasSuffix(d.Name(), ".go"):
			dirs[dir] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range slices.Sorted(maps.Keys(dirs)) {
		if name := layoutName(dir, modules); !named[name] {
			t.Errorf("docs/architecture.md's layout does not name %s", name)
			named[name] = true // once
		}
	}
}

// layoutName is how the layout names dir: a package by its path, a
// directory of a tool module by the module (hack/tools's modules as
// hack/tools/*).
func layoutName(dir string, modules []string) string {
	for _, m := range modules {
		if dir == m || strings.HasPrefix(dir, m+"/") {
			if strings.HasPrefix(m, "hack/tools/") {
				return "hack/tools/*"
			}
			return m
		}
	}
	return dir
}
