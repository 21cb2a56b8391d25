package main

import (
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestPushToARegistry pushes `make image`'s archive with the built crane,
// as docs/deploy.md shows, to a registry served in-process, and pulls it
// back: the same image (manifest digest), so its layers, entrypoint, user
// and labels are the archive's.
func TestPushToARegistry(t *testing.T) {
	bin := filepath.Join("..", "..", "bin")
	archive, crane := filepath.Join(bin, "images", "student-bridge.tar"), filepath.Join(bin, "crane")
	for _, f := range []string{archive, crane} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("%v: make image and make %s build it (make test does)", err, f)
		}
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/student-bridge:v0.2.0"
	if out, err := exec.Command(crane, "push", archive, ref).CombinedOutput(); err != nil {
		t.Fatalf("crane push %s %s: %v\n%s", archive, ref, err, out)
	}

	want, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Image(r)
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	wd, err := want.Digest()
	if err != nil {
		t.Fatal(err)
	}
	gd, err := got.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if wd != gd {
		t.Errorf("pulled %s as %s; the archive's image is %s", ref, gd, wd)
	}
	cf, err := got.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if c := cf.Config; strings.Join(c.Entrypoint, " ") != "/student-bridge" || c.User != "65532:65532" || c.Labels["org.opencontainers.image.version"] == "" {
		t.Errorf("pulled image's config: entrypoint %v, user %q, labels %v", c.Entrypoint, c.User, c.Labels)
	}
}
