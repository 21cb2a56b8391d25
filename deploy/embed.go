// Package deploy holds the manifests users apply. The Go side embeds the
// generated CRD so that tests and the local stack install exactly what
// users install.
package deploy

import "embed"

// CRDs holds deploy/crd/*.yaml.
//
//go:embed crd/*.yaml
var CRDs embed.FS

// Admission holds deploy/admission/*.yaml: the MutatingAdmissionPolicy that
// adds the bridge's finalizer to Students as they are created, and its
// binding.
//
//go:embed admission/*.yaml
var Admission embed.FS
