package reconciler

// NewStudentWatch is newStudentWatch, for the tests of reconciler_test,
// which start an API server.
var NewStudentWatch = newStudentWatch
