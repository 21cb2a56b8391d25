// Package publicapi names the module's public Go API, the packages a
// business service imports and the project promises to keep (semantic
// versioning): api/v1, api/contract and consumer. Everything else in the
// module is the bridge's implementation: under internal/, where Go lets
// no other module import it, or the reconciler and sink packages, which
// only the bridge's own wiring uses and whose API may change in any
// release.
//
// Its tests are the promise's gates: a public package builds without
// controller-runtime or client-go and imports no other package of the
// module, and its API is compatible with the last release's (apidiff, the
// tool make builds into bin/) unless the module's path names a new major
// version.
package publicapi

// Packages are the public packages, relative to the module's root.
var Packages = []string{"api/v1", "api/contract", "consumer"}
