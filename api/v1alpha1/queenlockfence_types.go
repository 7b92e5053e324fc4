package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// QueenLockFenceSpec names the objects bound to one slot of a lock: the
// objects whose fence record every acquire of that slot raises before it
// answers. The guard webhook adds an object here before it admits the
// write that binds it, so an acquire that reads this object from the API
// server (a GET, served from etcd) finds every object bound before its own
// permit was stored, at the cost of one read whatever the cluster holds.
//
// Only the manager writes it. An entry can outlive its object (deleted,
// taken out of the fence, bound elsewhere): a raise skips such entries, and
// the webhook drops them when the slot is full.
type QueenLockFenceSpec struct {
	// lock is the lock or semaphore whose slot this is. It cannot change.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="lock is immutable"
	Lock string `json:"lock"`

	// slot is the slot, 0 to 1023. It cannot change.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1023
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="slot is immutable"
	Slot int32 `json:"slot"`

	// objects are the objects bound to the slot, at most 32 (the most one
	// slot may have).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Objects []FencedObject `json:"objects,omitempty"`
}

// FencedObject is one object bound to a slot, in the fence's namespace.
type FencedObject struct {
	// group is the object's API group, empty for the core group.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Group string `json:"group,omitempty"`
	// version is the API version the guard webhook saw it written at.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Version string `json:"version"`
	// resource is the object's resource, for example configmaps.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Resource string `json:"resource"`
	// name is the object's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// since is when a write last bound the object to the slot, by the
	// clock of the replica whose webhook admitted it. An entry whose object
	// is gone is dropped only once since is older than any request
	// kube-apiserver may still be holding: the binding write may not be
	// stored yet.
	// +required
	Since metav1.MicroTime `json:"since"`
}

// QueenLockFence is the list of objects bound to one slot of a lock, named
// as the slot's permit. Created by the guard webhook at the first binding;
// read by every acquire of the slot.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=qlfence
// +kubebuilder:printcolumn:name="Lock",type=string,JSONPath=`.spec.lock`
// +kubebuilder:printcolumn:name="Slot",type=integer,JSONPath=`.spec.slot`
// +kubebuilder:printcolumn:name="Objects",type=string,JSONPath=`.spec.objects[*].name`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type QueenLockFence struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is the standard object metadata. The name is the slot's
	// permit's name.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the slot and its bound objects.
	// +required
	Spec QueenLockFenceSpec `json:"spec"`
}

// QueenLockFenceList is a list of QueenLockFence objects.
//
// +kubebuilder:object:root=true
type QueenLockFenceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []QueenLockFence `json:"items"`
}

func init() {
	SchemeBuilder.Register(&QueenLockFence{}, &QueenLockFenceList{})
}
