// Command ociimage builds a container image from static binaries and files,
// with no container engine and no base image, and writes it as an image
// archive that `ctr images import` (and `docker load`) read. The test node's
// images are made with it: student-bridge (`make image`), nats-server and
// the pod sandbox's pause program.
//
//	ociimage -tag student-bridge:v0.2.0 -out bin/images/student-bridge.tar \
//	    -file bin/image/student-bridge:/student-bridge:0755 \
//	    -file /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:0644 \
//	    -entrypoint /student-bridge -user 65532:65532 -label org.opencontainers.image.version=v0.2.0
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// list is a repeatable string flag.
type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

// file is one file of the image's only layer.
type file struct {
	src, dst string
	mode     int64
}

func main() {
	var files, labels, env list
	out := flag.String("out", "", "Path of the image archive to write (required).")
	tag := flag.String("tag", "", "The image's name and tag, e.g. student-bridge:v0.2.0 (required).")
	entrypoint := flag.String("entrypoint", "", "The image's entrypoint: a path in the image (required).")
	user := flag.String("user", "65532:65532", "The user:group the image runs as.")
	flag.Var(&files, "file", "SRC:DST[:MODE] a file of the host at DST in the image, octal MODE (default 0644); repeatable.")
	flag.Var(&labels, "label", "KEY=VALUE an image label; repeatable.")
	flag.Var(&env, "env", "KEY=VALUE an environment variable of the image; repeatable.")
	flag.Parse()
	if err := run(*out, *tag, *entrypoint, *user, files, labels, env); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func run(out, tag, entrypoint, user string, specs, labelSpecs, env []string) error {
	if out == "" || tag == "" || entrypoint == "" {
		return errors.New("-out, -tag and -entrypoint are required")
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("-tag %q: %w", tag, err)
	}
	var files []file
	for _, s := range specs {
		f, err := parseFile(s)
		if err != nil {
			return err
		}
		files = append(files, f)
	}
	labels := map[string]string{}
	for _, l := range labelSpecs {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return fmt.Errorf("-label %q: not KEY=VALUE", l)
		}
		labels[k] = v
	}
	layerTar, err := layer(files)
	if err != nil {
		return err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{
		Entrypoint: []string{entrypoint},
		User:       user,
		Labels:     labels,
		Env:        append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, env...),
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(path.Dir(out), 0o755); err != nil {
		return err
	}
	return tarball.WriteToFile(out, ref, img)
}

func parseFile(s string) (file, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || !path.IsAbs(parts[1]) {
		return file{}, fmt.Errorf("-file %q: not SRC:/DST[:MODE]", s)
	}
	f := file{src: parts[0], dst: parts[1], mode: 0o644}
	if len(parts) == 3 {
		m, err := strconv.ParseInt(parts[2], 8, 32)
		if err != nil {
			return file{}, fmt.Errorf("-file %q: mode: %w", s, err)
		}
		f.mode = m
	}
	return f, nil
}

// layer is the tar of the image's files, owned by root, with the parent
// directories each needs, at a fixed time so that the same inputs give the
// same image digest.
func layer(files []file) ([]byte, error) {
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{}
	sort.Slice(files, func(i, j int) bool { return files[i].dst < files[j].dst })
	for _, f := range files {
		var parents []string
		for d := path.Dir(f.dst); d != "/" && !dirs[d]; d = path.Dir(d) {
			parents = append(parents, d)
			dirs[d] = true
		}
		for i := len(parents) - 1; i >= 0; i-- {
			if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(parents[i], "/") + "/", Mode: 0o755, ModTime: epoch}); err != nil {
				return nil, err
			}
		}
		data, err := os.ReadFile(f.src)
		if err != nil {
			return nil, err
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.dst, "/"), Mode: f.mode, Size: int64(len(data)), ModTime: epoch}
		if err := w.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := w.Write(data); err != nil {
			return nil, err
		}
	}
	// Programs write temporary files under /tmp; with readOnlyRootFilesystem
	// a pod mounts a volume there.
	if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777, ModTime: epoch}); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
