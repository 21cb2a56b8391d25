package bridge

// ReleaseNamespace is releaseNamespace, for a test to page through a few
// Students as release-finalizers pages through many.
var ReleaseNamespace = releaseNamespace
