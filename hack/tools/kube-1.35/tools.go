//go:build tools

// Package tools pins the kube-apiserver of Kubernetes 1.35 that make
// test-compat runs the compatibility tier against.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
