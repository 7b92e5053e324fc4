// Package v1alpha1 holds the QueenLock API: one object is one permit, one slot
// of a lock or semaphore. It holds types only; the rules that govern them live
// in the permit package.
//
// +kubebuilder:object:generate=true
// +groupName=locks.queen.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of QueenLock.
	GroupVersion = schema.GroupVersion{Group: "locks.queen.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this group version.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion} //nolint:staticcheck // SA1019: kubebuilder's layout; moving to runtime.SchemeBuilder changes this package's exported API

	// AddToScheme adds the types of this group version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
