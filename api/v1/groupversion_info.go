// Package v1 contains the Student API of the example.k8s.io group, version v1,
// and the constants of the contract between the bridge and its consumers.
//
// It imports apimachinery only, so consumers can use the types without
// pulling in controller-runtime.
//
// It is part of the module's public API, with api/contract and consumer:
// what it exports stays compatible from one release to the next, and make
// test compares it with the last release's (internal/publicapi).
//
// +kubebuilder:object:generate=true
// +groupName=example.k8s.io
package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of the Student API.
	GroupVersion = schema.GroupVersion{Group: "example.k8s.io", Version: "v1"}

	// SchemeBuilder registers the Student types with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the Student types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Resource returns the group-qualified resource for the given plural name.
func Resource(resource string) schema.GroupResource {
	return GroupVersion.WithResource(resource).GroupResource()
}

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Student{}, &StudentList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
