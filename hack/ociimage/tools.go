//go:build tools

package main

// crane pushes `make image`'s archive to a registry (docs/deploy.md); the
// Makefile builds it from this module, so it is the version the image is
// written with.
import _ "github.com/google/go-containerregistry/cmd/crane"
