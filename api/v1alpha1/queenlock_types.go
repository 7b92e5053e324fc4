package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// QueenLockSpec is the state of one held permit. The times are stamped by the
// admission webhook from the API server side's clock; whatever a client sends
// in them is replaced.
//
// The rules below re-check every write after all mutating webhooks have run,
// inside the API server, with no further network call. They need no clock:
// the renewTime the webhook stamps is the moment of admission, so "before
// expiry" is renewTime < the old expireTime.
//
// kube-apiserver runs them on every write of a permit, renews included, and
// each field a rule reads costs it a lookup that copies the schema of every
// field of the spec: they once cost a renew 0.5 ms and 300 KB of garbage,
// more than any other step of the write. So the rules read each field as
// few times as they can (test/bench's BenchmarkCRDRulesOnARenew): the
// checks of a write's times are one rule and the checks of a transition
// another, each with a messageExpression that says which check failed, and
// the spec of an update is compared whole with the old one only when the
// transition checks have failed. (Optional strings are compared after
// has(): compared as optionals they are costed as unbounded, and the CRD
// is refused.) The three times are stamped together, so
// a stored permit with a renewTime has all three; the transition rule
// guards on that one, and a write without them fails the times rule (the
// transition rule, reading them unguarded, then fails too, with a "no such
// key" cause of its own: only a write that no webhook stamped gets there).
//
// An update that leaves the spec as it is passes the transition rule: the
// webhook admits such writes only on a permit that is being deleted (the
// garbage collector removing its finalizer), and refuses them otherwise. A
// renew keeps the holder's pod, the holding's first token once the
// webhook recorded it, and the leader election fields; a takeover keeps
// leaderTransitions or adds one to it.
// +kubebuilder:validation:XValidation:rule="self.slot < self.limit",message="slot must be below limit"
// +kubebuilder:validation:XValidation:rule="has(self.acquireTime) && has(self.renewTime) && has(self.expireTime) && (self.expireTime - self.renewTime).getMilliseconds() == self.ttlSeconds * 1000",messageExpression="has(self.acquireTime) && has(self.renewTime) && has(self.expireTime) ? 'expireTime must be renewTime plus ttlSeconds' : 'acquireTime, renewTime and expireTime are stamped by the admission webhook: is it running?'"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.renewTime) || (self.acquireTime == oldSelf.acquireTime ? self.owner == oldSelf.owner && self.renewTime > oldSelf.renewTime && self.renewTime < oldSelf.expireTime && (has(self.holderPod) ? has(oldSelf.holderPod) && self.holderPod == oldSelf.holderPod : !has(oldSelf.holderPod)) && (!has(oldSelf.firstToken) || self.?firstToken == oldSelf.?firstToken) && self.?leaderTransitions == oldSelf.?leaderTransitions && (has(self.preferredHolder) ? has(oldSelf.preferredHolder) && self.preferredHolder == oldSelf.preferredHolder : !has(oldSelf.preferredHolder)) && (has(self.strategy) ? has(oldSelf.strategy) && self.strategy == oldSelf.strategy : !has(oldSelf.strategy)) : self.renewTime >= oldSelf.expireTime && self.acquireTime == self.renewTime && self.?leaderTransitions.orValue(0) - oldSelf.?leaderTransitions.orValue(0) in [0, 1]) || self == oldSelf",message="not a lock transition: a renew keeps the owner and acquireTime and lands before expireTime; a takeover comes at or after expireTime",messageExpression="self.acquireTime == oldSelf.acquireTime && self.owner == oldSelf.owner && self.renewTime > oldSelf.renewTime && self.renewTime < oldSelf.expireTime ? (!(has(self.holderPod) ? has(oldSelf.holderPod) && self.holderPod == oldSelf.holderPod : !has(oldSelf.holderPod)) ? 'holderPod cannot change on a renew; a takeover replaces it' : has(oldSelf.firstToken) && self.?firstToken != oldSelf.?firstToken ? 'firstToken is stamped by the admission webhook and cannot change within a holding' : 'leaderTransitions, preferredHolder and strategy cannot change on a renew') : self.acquireTime != oldSelf.acquireTime && self.renewTime >= oldSelf.expireTime && self.acquireTime == self.renewTime ? 'leaderTransitions may only stay or grow by one on a takeover' : 'not a lock transition: a renew keeps the owner and acquireTime and lands before expireTime; a takeover comes at or after expireTime'"
type QueenLockSpec struct {
	// lock is the name of the lock or semaphore this permit belongs to:
	// 1 to 256 bytes of UTF-8, no control character and no '#'.
	// It cannot change once the permit exists.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="lock is immutable"
	Lock string `json:"lock"`

	// slot is the permit's index within the semaphore, from 0 to limit-1.
	// A lock is a semaphore of limit 1 whose only slot is 0.
	// It cannot change once the permit exists.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1023
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="slot is immutable"
	Slot int32 `json:"slot"`

	// limit is the number of permits the holder asked the semaphore to have.
	// It is informational: the limit is the callers', stored nowhere else.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	Limit int32 `json:"limit"`

	// owner names the holder, 1 to 256 bytes. Two callers that send the same
	// owner are one holder.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Owner string `json:"owner"`

	// ttlSeconds is the lifetime the holder declares, counted from each
	// acquire or renew as the server admits it.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=31536000
	TTLSeconds int64 `json:"ttlSeconds"`

	// holderPod is the pod the holder runs in, when it runs in one. The
	// controller frees the permit as soon as that pod is gone (deleted, or
	// another pod under its name) or has finished. A pod may only name
	// itself. It cannot change while the permit is held; a takeover
	// replaces it.
	// +optional
	HolderPod *PodRef `json:"holderPod,omitempty"`

	// acquireTime is when the current holder acquired the permit. An update
	// that clears it asks to take over an expired permit; an update that keeps
	// it is a renew. Stamped by the server.
	// +optional
	AcquireTime *metav1.MicroTime `json:"acquireTime,omitempty"`

	// renewTime is when the permit was last acquired or renewed. Stamped by
	// the server.
	// +optional
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`

	// expireTime is renewTime plus ttlSeconds: from then on the permit is
	// free to take over, and the controller deletes it. Stamped by the server.
	// +optional
	ExpireTime *metav1.MicroTime `json:"expireTime,omitempty"`

	// firstToken is the first token of the current holding: the token its
	// acquire answered, recorded by the webhook at the holding's first
	// renew and cleared by an acquire or takeover. A renew or release whose
	// answer was lost, retried with a token from firstToken up to the
	// current one by the same owner, is carried through on whichever
	// replica the retry reaches; a token of an earlier holding is below it.
	// Stamped by the server.
	// +optional
	// +kubebuilder:validation:Minimum=1
	FirstToken int64 `json:"firstToken,omitempty"`

	// leaderTransitions counts how many times the permit changed hands,
	// for leader election over a permit (package election): client-go's
	// LeaderElectionRecord.LeaderTransitions. A renew keeps it; a takeover
	// keeps it or adds one. A create may set it, since a new permit has no
	// earlier count to compare with: the candidate carries on from the count
	// it last saw on the permit before that was released or expired.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483646
	LeaderTransitions int32 `json:"leaderTransitions,omitempty"`

	// preferredHolder is the identity that coordinated leader election asks
	// to lead next (client-go's LeaderElectionRecord.PreferredHolder). It is
	// part of a holding: set by the create or takeover that starts it and
	// unchanged by its renews.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	PreferredHolder string `json:"preferredHolder,omitempty"`

	// strategy is the coordinated leader election strategy of the holding
	// (client-go's LeaderElectionRecord.Strategy). Like preferredHolder it
	// is set by the create or takeover that starts a holding and unchanged
	// by its renews.
	// +optional
	// +kubebuilder:validation:Enum=OldestEmulationVersion
	// +kubebuilder:validation:MaxLength=64
	Strategy string `json:"strategy,omitempty"`
}

// PodRef names one pod, by namespace, name and UID: a pod deleted and
// created again under the same name is another pod.
type PodRef struct {
	// namespace is the pod's namespace, which need not be the permit's: a
	// pod of team-b whose ServiceAccount may hold locks in team-a locks
	// there. The webhook fills in the writer's pod namespace (or, for a
	// permit written before this field, the permit's own) when it is empty.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`

	// name is the pod's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// uid is the pod's metadata.uid.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	UID string `json:"uid"`
}

// QueenLock is one permit of a lock or semaphore. Its resourceVersion is the
// permit's fencing token: every write to it is a lock transition.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=qlock,categories=queen-locks
// +kubebuilder:printcolumn:name="Lock",type=string,JSONPath=`.spec.lock`
// +kubebuilder:printcolumn:name="Slot",type=integer,JSONPath=`.spec.slot`
// +kubebuilder:printcolumn:name="Owner",type=string,JSONPath=`.spec.owner`
// +kubebuilder:printcolumn:name="Token",type=string,JSONPath=`.metadata.resourceVersion`
// +kubebuilder:printcolumn:name="Since",type=date,JSONPath=`.spec.acquireTime`
// +kubebuilder:printcolumn:name="Renewed",type=date,JSONPath=`.spec.renewTime`
// +kubebuilder:printcolumn:name="Expires",type=string,JSONPath=`.spec.expireTime`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type QueenLock struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is the standard object metadata. Its name is
	// permitName(spec.lock, spec.slot).
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the permit's holder and lifetime.
	// +required
	Spec QueenLockSpec `json:"spec"`
}

// QueenLockList is a list of QueenLock permits.
//
// +kubebuilder:object:root=true
type QueenLockList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []QueenLock `json:"items"`
}

func init() {
	SchemeBuilder.Register(&QueenLock{}, &QueenLockList{})
}
