// Package version names the release a binary was built from: the version
// in `student-bridge version`, the startup log, the
// student_bridge_build_info metric and the image's labels.
package version

import (
	"runtime"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Version is the release this source is, or comes after: CHANGELOG.md's
// newest section and the chart's appVersion name the same one (a test
// checks). Builds between two releases say so through Commit.
var Version = "v0.2.0"

// Commit is the git commit the binary was built from, set by the
// Makefile's -ldflags -X; "unknown" in a build without it (go run, go test).
var Commit = "unknown"

// String is the one-line form `student-bridge version` prints.
func String() string {
	return "student-bridge " + Version + " (commit " + Commit + ", " + runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")"
}

var buildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "student_bridge_build_info",
	Help: "Always 1; its labels name the release, commit and Go version the running bridge was built from.",
}, []string{"version", "commit", "goversion"})

var registerOnce sync.Once

// RegisterMetrics registers student_bridge_build_info with controller-
// runtime's registry, the one the bridge's manager serves; once per process.
func RegisterMetrics() {
	registerOnce.Do(func() {
		buildInfo.WithLabelValues(Version, Commit, runtime.Version()).Set(1)
		metrics.Registry.MustRegister(buildInfo)
	})
}
