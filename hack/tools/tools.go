//go:build tools

// Package tools pins the versions of the binaries the Makefile builds into
// bin/ from this module: the Kubernetes binaries (the control plane and the
// test node's), helm, which the chart tests run, promtool and the
// Prometheus server, which check and fire the alert rules, the Prometheus
// Operator's API types, from which `make monitoring-crds` generates the
// CRDs the chart tests install (hack/crds), controller-gen, and apidiff,
// which compares the public Go API with the last release's. CoreDNS
// and etcd are commands of this module (cmd/). They share one module so
// that the Kubernetes libraries they all use resolve to one version and
// compile once.
package tools

import (
	_ "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
	_ "golang.org/x/exp/cmd/apidiff"
	_ "helm.sh/helm/v4/cmd/helm"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
)
