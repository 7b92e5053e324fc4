package permit

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

// A handover ends a holding by giving its permit to the head of the
// lock's line in place: one update, conditional on the ending holding's
// token, that writes the waiter's owner, limit, lifetime and pod and
// names the waiter (spec.waiter). A release, an expiry or the end of the
// holder's pod makes one when a waiter can use the slot, instead of the
// delete that would leave the slot free, for any acquire, until the
// waiter's own create landed. Its resourceVersion is the new holding's
// first token, above every token of the holding it ends.

// IsHandover tells whether writing obj over old hands the permit to a
// waiter: an acquire (acquireTime cleared, or from the manager set anew)
// that names a waiter the permit was not handed to before. It may come
// before the permit expires; who may make it is judged against the line,
// by the webhook (JudgeHandover) or by the manager that writes it.
func IsHandover(old, obj *locksv1alpha1.QueenLock, manager bool) bool {
	if old == nil || obj.Spec.Waiter == "" || obj.Spec.Waiter == old.Spec.Waiter {
		return false
	}
	return obj.Spec.AcquireTime == nil || (manager && !obj.Spec.AcquireTime.Equal(old.Spec.AcquireTime))
}

// HandedTTL is the ttlSeconds a handover to w writes. A gated pod's waiter
// gets its permit's whole lifetime: the gate lets the pod in with that
// permit and nobody renews it. Any other waiter gets its own ttlSeconds
// (at most what it asked of the permit): were its carrier dead, the slot
// is then held no longer than the waiter would have held the line, and a
// live carrier renews the permit to what it asked (HoldSeconds) when it
// sees it.
func HandedTTL(w *locksv1alpha1.QueenLockWaiter) int64 {
	hold := w.Spec.HoldSeconds
	if w.Spec.Pod != nil {
		if hold <= 0 {
			return MaxTTLSeconds
		}
		return hold
	}
	ttl := int64(w.Spec.TTLSeconds)
	if hold > 0 && hold < ttl {
		ttl = hold
	}
	return max(ttl, 1)
}

// HandedPod is the holder pod a handover to w records: the gated pod, or
// the pod the waiting acquire's holder runs in.
func HandedPod(w *locksv1alpha1.QueenLockWaiter) *locksv1alpha1.PodRef {
	if w.Spec.Pod != nil {
		return w.Spec.Pod.DeepCopy()
	}
	return w.Spec.HolderPod.DeepCopy()
}

// Handed is old handed to waiter w, unstamped (acquireTime cleared, as
// any acquire sends it): send it as an update conditional on old's
// resourceVersion.
func Handed(old *locksv1alpha1.QueenLock, w *locksv1alpha1.QueenLockWaiter) *locksv1alpha1.QueenLock {
	p := old.DeepCopy()
	p.Spec.Owner = w.Spec.Owner
	p.Spec.Limit = max(w.Spec.Limit, p.Spec.Slot+1)
	p.Spec.TTLSeconds = HandedTTL(w)
	p.Spec.HolderPod = HandedPod(w)
	p.Spec.Waiter = w.Name
	p.Spec.AcquireTime, p.Spec.RenewTime, p.Spec.ExpireTime = nil, nil, nil
	p.Spec.FirstToken = 0
	p.Spec.PreferredHolder, p.Spec.Strategy = "", ""
	return p
}

// JudgeHandover refuses a handover obj that is not what Handed writes for
// head, the waiter at the head of the line that can use obj's slot (nil
// when none can). A handover to anyone else would let its writer pass the
// line, or name a pod or lifetime the waiter never asked for.
func JudgeHandover(obj *locksv1alpha1.QueenLock, head *locksv1alpha1.QueenLockWaiter) error {
	path := specPath.Child("waiter")
	if head == nil {
		return &Refusal{Errs: field.ErrorList{field.Forbidden(path, fmt.Sprintf(
			"names waiter %q, but no waiter in the line of lock %q can use slot %d: release the permit (delete it) instead",
			obj.Spec.Waiter, obj.Spec.Lock, obj.Spec.Slot))}}
	}
	if obj.Spec.Waiter != head.Name || obj.Spec.Owner != head.Spec.Owner {
		return &Refusal{Errs: field.ErrorList{field.Forbidden(path, fmt.Sprintf(
			"a handover goes to the head of the line of lock %q that can use slot %d: waiter %q (owner %q), not waiter %q (owner %q)",
			obj.Spec.Lock, obj.Spec.Slot, head.Name, head.Spec.Owner, obj.Spec.Waiter, obj.Spec.Owner))}}
	}
	var errs field.ErrorList
	if want := max(head.Spec.Limit, obj.Spec.Slot+1); obj.Spec.Limit != want {
		errs = append(errs, field.Invalid(specPath.Child("limit"), obj.Spec.Limit, fmt.Sprintf("a handover to waiter %q writes its limit, %d", head.Name, want)))
	}
	if want := HandedTTL(head); obj.Spec.TTLSeconds != want {
		errs = append(errs, field.Invalid(specPath.Child("ttlSeconds"), obj.Spec.TTLSeconds, fmt.Sprintf("a handover to waiter %q writes %d", head.Name, want)))
	}
	want := HandedPod(head)
	if want != nil && want.Namespace == "" {
		want.Namespace = obj.Namespace // as Stamp fills it in
	}
	if !equality.Semantic.DeepEqual(obj.Spec.HolderPod, want) {
		errs = append(errs, field.Invalid(specPath.Child("holderPod"), obj.Spec.HolderPod, fmt.Sprintf("a handover to waiter %q records the waiter's pod", head.Name)))
	}
	if obj.Spec.PreferredHolder != "" || obj.Spec.Strategy != "" {
		errs = append(errs, field.Forbidden(specPath.Child("preferredHolder"), "a handover begins a holding of a waiter, which sets no leader election preference"))
	}
	return invalid(errs)
}
