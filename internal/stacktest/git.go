package stacktest

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Archive writes paths (files or folders of the repository at root) as
// they were at commit into dir: what the gates against a previous release
// compare with. A clone with history is needed.
func Archive(t testing.TB, root, commit, dir string, paths ...string) {
	t.Helper()
	archive := exec.Command("git", append([]string{"-C", root, "archive", commit}, paths...)...)
	var tarball bytes.Buffer
	archive.Stdout, archive.Stderr = &tarball, os.Stderr
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s %s (a clone with history is needed): %v", commit, strings.Join(paths, " "), err)
	}
	untar := exec.Command("tar", "-x", "-C", dir)
	untar.Stdin = &tarball
	if out, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("untar: %v: %s", err, out)
	}
}
