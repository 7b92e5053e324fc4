package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// QueenLockWaiterSpec is one acquire waiting for a slot of a lock: its place
// in the lock's line. The line is the waiters of one lock ordered by the
// resourceVersion each got when it was created, as the API server
// assigned it: never a replica's clock.
//
// A waiter is kept alive by its carrier (the route replica, process or
// manager that waits for it), which writes renewTime every third of
// ttlSeconds. Any replica of the manager deletes a waiter whose object has
// not changed for ttlSeconds by its own clock: the carrier is gone.
type QueenLockWaiterSpec struct {
	// lock is the lock or semaphore waited for: 1 to 256 bytes of UTF-8, no
	// control character and no '#'. It cannot change.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="lock is immutable"
	Lock string `json:"lock"`

	// owner is the owner the waiting acquire will hold the permit as, 1 to
	// 256 bytes. It cannot change.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="owner is immutable"
	Owner string `json:"owner"`

	// limit is the semaphore's limit the waiter asked for, 1 to 1024: it
	// can use slots 0 to limit-1 only.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="limit is immutable"
	Limit int32 `json:"limit"`

	// ttlSeconds is how long the waiter outlives its carrier's last write:
	// 3 to 300 seconds.
	// +required
	// +kubebuilder:validation:Minimum=3
	// +kubebuilder:validation:Maximum=300
	TTLSeconds int32 `json:"ttlSeconds"`

	// position is the resourceVersion the waiter's create was given: its
	// place in the line. The carrier records it at its first renew, since
	// a renew changes the resourceVersion; until then the
	// resourceVersion itself is the place. It cannot change once set.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="position cannot change once recorded"
	Position int64 `json:"position,omitempty"`

	// carrier says what waits for this waiter, for people: a route
	// replica, a process over the Kubernetes API, or the gate.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Carrier string `json:"carrier,omitempty"`

	// pod is the gated pod that waits, when a gated pod does. The gate
	// carries such a waiter while the pod waits and removes it when the
	// pod is let in or leaves the line; it is not renewed.
	// +optional
	Pod *PodRef `json:"pod,omitempty"`

	// since is when the waiter began to wait, by its carrier's clock, to
	// the microsecond. It orders nothing.
	// +optional
	Since *metav1.MicroTime `json:"since,omitempty"`

	// renewTime is the carrier's last renew, by its own clock. It orders
	// nothing and nobody judges it: the sweeper counts from when it saw the
	// object change.
	// +optional
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`
}

// QueenLockWaiter is one acquire waiting in a lock's line. `kubectl get
// queenlocks` lists permits only; the line is `kubectl get queenlockwaiters`.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=qlwait,categories=queen-locks
// +kubebuilder:printcolumn:name="Lock",type=string,JSONPath=`.spec.lock`
// +kubebuilder:printcolumn:name="Owner",type=string,JSONPath=`.spec.owner`
// +kubebuilder:printcolumn:name="Limit",type=integer,JSONPath=`.spec.limit`
// +kubebuilder:printcolumn:name="Position",type=string,JSONPath=`.spec.position`
// +kubebuilder:printcolumn:name="Carrier",type=string,JSONPath=`.spec.carrier`,priority=1
// +kubebuilder:printcolumn:name="Since",type=date,JSONPath=`.spec.since`
// +kubebuilder:printcolumn:name="Renewed",type=date,JSONPath=`.spec.renewTime`
type QueenLockWaiter struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is the standard object metadata. The name is generated.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the waiter's lock, owner and liveness.
	// +required
	Spec QueenLockWaiterSpec `json:"spec"`
}

// QueenLockWaiterList is a list of QueenLockWaiter objects.
//
// +kubebuilder:object:root=true
type QueenLockWaiterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []QueenLockWaiter `json:"items"`
}

func init() {
	SchemeBuilder.Register(&QueenLockWaiter{}, &QueenLockWaiterList{})
}
