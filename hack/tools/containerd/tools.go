//go:build tools

// Package tools pins containerd, the container runtime of the test node.
// It has a module of its own: its k8s.io versions differ from
// kube-apiserver's.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
