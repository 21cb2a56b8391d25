//go:build tools

// Package prometheus pins promtool, which checks and unit-tests the alert
// rules (deploy/monitoring), the Prometheus server the alerts are seen
// firing on, and the Prometheus Operator's API types, from which `make
// monitoring-crds` generates the PrometheusRule and ServiceMonitor CRDs the
// chart tests install (hack/crds). It is a module of its own, as helm is: its dependencies never
// mix with the other tools', and only the targets that need them wait for
// their build.
package prometheus

import (
	_ "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
