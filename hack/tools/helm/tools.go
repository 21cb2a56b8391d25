//go:build tools

// Package helm pins the helm CLI that the chart tests run. It is a module of
// its own so that its dependencies (which resolve other k8s.io versions than
// kube-apiserver's) never mix with the other tools, and so that only the
// targets that need helm wait for its build.
package helm

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
