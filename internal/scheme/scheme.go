// Package scheme holds the one runtime.Scheme every client of the bridge,
// its commands and its tests use: client-go's types and Students.
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// New returns a Scheme with client-go's built-in types and Students.
func New() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(studentv1.AddToScheme(s))
	return s
}
