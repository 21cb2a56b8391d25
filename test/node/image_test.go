package node_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/x509"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/version"
)

// imageArchive reads an image archive as `make image` writes it (the
// format `docker save` writes and `ctr images import` reads): its tags, its
// config and the files of its layers.
func imageArchive(t *testing.T, path string) (tags []string, config imageConfig, files map[string]*tar.Header, contents map[string][]byte) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Skipf("%s: %v (make image builds it)", path, err)
	}
	defer f.Close()
	entries := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		entries[h.Name] = b
	}
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(entries["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("manifest.json: %v (%d images)", err, len(manifest))
	}
	if err := json.Unmarshal(entries[manifest[0].Config], &config); err != nil {
		t.Fatalf("config: %v", err)
	}
	files, contents = map[string]*tar.Header{}, map[string][]byte{}
	for _, l := range manifest[0].Layers {
		zr, err := gzip.NewReader(bytes.NewReader(entries[l]))
		if err != nil {
			t.Fatal(err)
		}
		lr := tar.NewReader(zr)
		for {
			h, err := lr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = h
			if contents[h.Name], err = io.ReadAll(lr); err != nil {
				t.Fatal(err)
			}
		}
	}
	return manifest[0].RepoTags, config, files, contents
}

// imageConfig is the part of an image's config the tests read.
type imageConfig struct {
	OS, Architecture string
	Config           struct {
		User       string
		Entrypoint []string
		Labels     map[string]string
	}
}

// TestImage: the image `make image` builds is what the manifests expect:
// tagged with the release, a static binary as its entrypoint, non-root
// (65532, as the Deployment's runAsUser), the version in its labels, and
// the CA roots a TLS connection to NATS verifies its server with.
func TestImage(t *testing.T) {
	tags, cfg, files, contents := imageArchive(t, filepath.Join(stack.RepoRoot(), "bin/images/student-bridge.tar"))
	if len(tags) != 1 || tags[0] != "student-bridge:"+version.Version {
		t.Errorf("tags %v, want student-bridge:%s", tags, version.Version)
	}
	if cfg.OS != "linux" || cfg.Architecture != "amd64" || cfg.Config.User != "65532:65532" || len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != "/student-bridge" {
		t.Errorf("config %+v", cfg)
	}
	if got := cfg.Config.Labels["org.opencontainers.image.version"]; got != version.Version {
		t.Errorf("label org.opencontainers.image.version %q, want %s", got, version.Version)
	}
	if h := files["student-bridge"]; h == nil || h.Mode&0o111 == 0 {
		t.Errorf("/student-bridge is missing or not executable: %+v", h)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(contents["etc/ssl/certs/ca-certificates.crt"]) {
		t.Error("the image has no CA roots at /etc/ssl/certs/ca-certificates.crt, where Go looks for them: TLS to NATS could verify no public certificate")
	}
}
