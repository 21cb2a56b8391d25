//go:build tools

// Package prometheus pins promtool, which checks and unit-tests the alert
// rules (deploy/monitoring), and the Prometheus server the alerts are seen
// firing on. It is a module of its own, as helm is: its dependencies never
// mix with the other tools', and only the targets that need them wait for
// their build.
package prometheus

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
