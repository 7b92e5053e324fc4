package permit

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

// Reasons a lock transition is refused, as the contract names them. An
// admission denial carries one as its Status reason.
const (
	// ReasonHeld: somebody else holds the permit and it has not expired.
	ReasonHeld = "held"
	// ReasonLost: the permit is no longer the caller's (expired or replaced).
	ReasonLost = "lost"
)

// Refusal is a write that is not a valid lock transition. Reason is ReasonHeld
// or ReasonLost when the write lost a race for the permit, and empty when the
// object itself is invalid; Errs names each field that is wrong.
type Refusal struct {
	Reason string
	Errs   field.ErrorList
}

func (r *Refusal) Error() string {
	msg := r.Errs.ToAggregate().Error()
	if r.Reason != "" {
		return r.Reason + ": " + msg
	}
	return msg
}

func invalid(errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return &Refusal{Errs: errs}
}

func refuse(reason string, path *field.Path, detail string) error {
	return &Refusal{Reason: reason, Errs: field.ErrorList{field.Forbidden(path, detail)}}
}

var specPath = field.NewPath("spec")

// Expired tells whether p's lifetime has ended at now. A permit without an
// expireTime was never stamped and counts as expired.
func Expired(p *locksv1alpha1.QueenLock, now time.Time) bool {
	return p.Spec.ExpireTime == nil || !now.Before(p.Spec.ExpireTime.Time)
}

// ValidateSpec checks the fields of a permit and that its object name is
// permitName(lock, slot).
func ValidateSpec(p *locksv1alpha1.QueenLock) field.ErrorList {
	var errs field.ErrorList
	s := p.Spec
	if err := ValidateName(s.Lock); err != nil {
		errs = append(errs, field.Invalid(specPath.Child("lock"), s.Lock, err.Error()))
	}
	if err := ValidateOwner(s.Owner); err != nil {
		errs = append(errs, field.Invalid(specPath.Child("owner"), s.Owner, err.Error()))
	}
	if err := ValidateTTL(s.TTLSeconds); err != nil {
		errs = append(errs, field.Invalid(specPath.Child("ttlSeconds"), s.TTLSeconds, err.Error()))
	}
	limitErr := ValidateLimit(int64(s.Limit))
	if limitErr != nil {
		errs = append(errs, field.Invalid(specPath.Child("limit"), s.Limit, limitErr.Error()))
	} else if err := ValidateSlot(int64(s.Slot), int64(s.Limit)); err != nil {
		errs = append(errs, field.Invalid(specPath.Child("slot"), s.Slot, err.Error()))
	}
	if len(errs) == 0 {
		if want := Name(s.Lock, int(s.Slot)); p.Name != want {
			errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), p.Name,
				fmt.Sprintf("must be %q, the permit name of lock %q slot %d", want, s.Lock, s.Slot)))
		}
	}
	return errs
}

// Caller is who sends a write, as admission reports it.
type Caller struct {
	// Manager is true for the queen-locks manager itself: the route writes
	// for callers it verified, and names their pods.
	Manager bool
	// PodNamespace, PodName and PodUID name the pod the credential is
	// bound to, when it is bound to one.
	PodNamespace, PodName, PodUID string
}

// Stamp decides whether writing obj over old (nil for a create) is a lock
// transition at now, and if so stamps the server's times and the lock label
// on obj. It is what the mutating webhook runs; the CRD's CEL rules check the
// stamped result once more after every mutating webhook has run.
//
//   - create: acquire a free slot.
//   - update that clears acquireTime (or, from the manager, sets a new
//     one: its takeovers come stamped): take over a permit that expired
//     more than grace ago (grace is the clock skew tolerated between
//     replicas).
//   - update that keeps acquireTime: renew, by the same owner, before expiry.
//   - update of a permit being deleted that changes nothing but its
//     finalizers: the garbage collector finishing a foreground or orphan
//     delete. It is admitted as it is (stamped is false): a released permit
//     must not keep its name taken.
//
// Anything else would change the token without being a transition, and is
// refused.
func Stamp(old, obj *locksv1alpha1.QueenLock, now time.Time, grace time.Duration, caller Caller) (stamped bool, err error) {
	if old != nil && old.DeletionTimestamp != nil {
		return false, finishDelete(old, obj)
	}
	if old != nil {
		// Before the fields: a new slot or lock would otherwise be told
		// as out of range, or as a wrong object name.
		if errs := validateImmutable(old, obj); len(errs) > 0 {
			return false, invalid(errs)
		}
	}
	if errs := ValidateSpec(obj); len(errs) > 0 {
		return false, invalid(errs)
	}
	if !caller.Manager {
		// Any write that leaves such an owner on the permit: a create, a
		// takeover, and a renew, which would change a gated pod's token.
		if err := ValidateOwnerOf(obj.Spec.Owner); err != nil {
			return false, invalid(field.ErrorList{field.Forbidden(specPath.Child("owner"), err.Error())})
		}
	}
	// The manager sends its takeovers already stamped (locks.AsManager):
	// a new acquireTime in place of a cleared one. Where this webhook still
	// sees one (the manager under another identity than the configuration
	// names, a configuration without the skip), it is a takeover like any
	// other, stamped again here; from anyone else a changed acquireTime is
	// refused below.
	takeover := old != nil && (obj.Spec.AcquireTime == nil ||
		(caller.Manager && !obj.Spec.AcquireTime.Equal(old.Spec.AcquireTime)))
	acquiring := old == nil || takeover
	if acquiring {
		defaultHolderPodNamespace(obj, caller)
	}
	if err := checkHolderPod(old, obj, caller); err != nil {
		return false, err
	}
	if old == nil {
		if errs := validateCreateMeta(obj); len(errs) > 0 {
			return false, invalid(errs)
		}
		setLockLabel(obj)
		stamp(obj, now, true)
		obj.Spec.FirstToken = 0
		return true, nil
	}
	// Labels are compared as sent, before the lock label is set: an edit of
	// the lock label is refused like any other label edit, not silently
	// undone and stored as a renew.
	if err := validateUpdate(old, obj); err != nil {
		return false, err
	}
	setLockLabel(obj)
	if takeover {
		if !Expired(old, now.Add(-grace)) {
			return false, heldBy(old)
		}
		if err := checkTransitions(old, obj); err != nil {
			return false, err
		}
		stamp(obj, now, true)
		obj.Spec.FirstToken = 0
		return true, nil
	}
	if !obj.Spec.AcquireTime.Equal(old.Spec.AcquireTime) {
		return false, invalid(field.ErrorList{field.Invalid(specPath.Child("acquireTime"), obj.Spec.AcquireTime,
			"must be left as it is to renew, or cleared to take over an expired permit")})
	}
	if err := checkRenew(old, obj, now); err != nil {
		return false, err
	}
	stamp(obj, now, false)
	if err := keepFirstToken(old, obj); err != nil {
		return false, err
	}
	return true, nil
}

// keepFirstToken records, at a holding's first renew, the token its
// acquire answered (the version being renewed), and keeps it at every
// later renew: a retried renew or release with any token of the holding,
// from that one to the current one, is then carried through by any
// replica, since the permit itself says where the holding began. An
// acquire or takeover clears it, so a token of an earlier holding is below
// the first token of every later one.
func keepFirstToken(old, obj *locksv1alpha1.QueenLock) error {
	if old.Spec.FirstToken != 0 {
		obj.Spec.FirstToken = old.Spec.FirstToken
		return nil
	}
	tok, err := Token(old.ResourceVersion)
	if err != nil {
		return fmt.Errorf("reading the token of permit %s being renewed: %w", old.Name, err)
	}
	obj.Spec.FirstToken = int64(tok)
	return nil
}

// defaultHolderPodNamespace fills in the namespace of a holder pod named
// without one: the writer's own pod's namespace, or else the permit's. The
// manager writes for callers, never for its own pod: its writes take the
// permit's namespace, whether the webhook (which sees the manager's pod
// token) or the manager itself (which stamps without one) decides them.
func defaultHolderPodNamespace(obj *locksv1alpha1.QueenLock, caller Caller) {
	hp := obj.Spec.HolderPod
	if hp == nil || hp.Namespace != "" {
		return
	}
	hp.Namespace = obj.Namespace
	if caller.PodName != "" && caller.PodNamespace != "" && !caller.Manager {
		hp.Namespace = caller.PodNamespace
	}
}

func setLockLabel(obj *locksv1alpha1.QueenLock) {
	if obj.Labels == nil {
		obj.Labels = map[string]string{}
	}
	obj.Labels[LockLabel] = LabelValue(obj.Spec.Lock)
}

// finishDelete admits a write to a permit that is being deleted only when
// it changes nothing but finalizers, and only removes them. A renew or
// takeover of it answers lost: deleting a permit is releasing it.
func finishDelete(old, obj *locksv1alpha1.QueenLock) error {
	if !equality.Semantic.DeepEqual(old.Spec, obj.Spec) {
		return refuse(ReasonLost, field.NewPath("metadata", "deletionTimestamp"),
			fmt.Sprintf("permit %s of lock %q is being deleted: it was released", old.Name, old.Spec.Lock))
	}
	rest, prev := obj.DeepCopy(), old.DeepCopy()
	rest.Finalizers, prev.Finalizers = nil, nil
	rest.ResourceVersion, prev.ResourceVersion = "", ""
	rest.ManagedFields, prev.ManagedFields = nil, nil
	if !equality.Semantic.DeepEqual(rest.ObjectMeta, prev.ObjectMeta) {
		return invalid(field.ErrorList{field.Forbidden(field.NewPath("metadata"),
			"a permit being deleted may only have finalizers removed")})
	}
	for _, f := range obj.Finalizers {
		if !slices.Contains(old.Finalizers, f) {
			return invalid(field.ErrorList{field.Forbidden(field.NewPath("metadata", "finalizers"),
				fmt.Sprintf("may not add %q: a permit being deleted may only have finalizers removed", f))})
		}
	}
	return nil
}

// checkHolderPod admits a holderPod only from the pod it names (proven by
// the pod-bound credential the write is sent with) or from the manager,
// which names the pod of a caller whose token it verified. Anyone else
// naming a pod could have a permit freed, or kept, by a pod it does not
// run in. A renew that leaves the holder pod as it was names nobody new.
func checkHolderPod(old, obj *locksv1alpha1.QueenLock, caller Caller) error {
	hp := obj.Spec.HolderPod
	if hp == nil || caller.Manager {
		return nil
	}
	if old != nil && obj.Spec.AcquireTime != nil && equality.Semantic.DeepEqual(hp, old.Spec.HolderPod) && caller.PodName == "" {
		return nil
	}
	if caller.PodName == "" {
		return invalid(field.ErrorList{field.Forbidden(specPath.Child("holderPod"),
			"may be set only by the pod it names, with its pod-bound ServiceAccount token, or by the queen-locks manager for a caller it verified")})
	}
	ns := hp.Namespace
	if ns == "" {
		ns = obj.Namespace // a permit written before holderPod named the namespace
	}
	if hp.Name != caller.PodName || ns != caller.PodNamespace || (caller.PodUID != "" && hp.UID != caller.PodUID) {
		return invalid(field.ErrorList{field.Forbidden(specPath.Child("holderPod"),
			fmt.Sprintf("names pod %s/%s (uid %s), but the request comes from pod %s/%s (uid %s): a pod may only name itself",
				hp.Namespace, hp.Name, hp.UID, caller.PodNamespace, caller.PodName, caller.PodUID))})
	}
	return nil
}

func checkRenew(old, obj *locksv1alpha1.QueenLock, now time.Time) error {
	if obj.Spec.Owner != old.Spec.Owner {
		return heldBy(old)
	}
	if !equality.Semantic.DeepEqual(obj.Spec.HolderPod, old.Spec.HolderPod) {
		return invalid(field.ErrorList{field.Invalid(specPath.Child("holderPod"), obj.Spec.HolderPod,
			"cannot change on a renew; a takeover replaces it")})
	}
	if err := checkElection(old, obj); err != nil {
		return err
	}
	if Expired(old, now) {
		return refuse(ReasonLost, specPath.Child("expireTime"),
			fmt.Sprintf("permit %s of lock %q expired at %s; acquire it again", old.Name, old.Spec.Lock, formatTime(old.Spec.ExpireTime)))
	}
	return nil
}

// checkElection keeps the leader election fields of a holding (package
// election) as they are on a renew: the count of transitions changes only
// when the permit changes hands, and the preferred holder and strategy are
// the holding's, set when it began.
func checkElection(old, obj *locksv1alpha1.QueenLock) error {
	var errs field.ErrorList
	if obj.Spec.LeaderTransitions != old.Spec.LeaderTransitions {
		errs = append(errs, field.Invalid(specPath.Child("leaderTransitions"), obj.Spec.LeaderTransitions,
			fmt.Sprintf("cannot change on a renew (it is %d)", old.Spec.LeaderTransitions)))
	}
	if obj.Spec.PreferredHolder != old.Spec.PreferredHolder {
		errs = append(errs, field.Invalid(specPath.Child("preferredHolder"), obj.Spec.PreferredHolder,
			"cannot change on a renew; a takeover sets it"))
	}
	if obj.Spec.Strategy != old.Spec.Strategy {
		errs = append(errs, field.Invalid(specPath.Child("strategy"), obj.Spec.Strategy,
			"cannot change on a renew; a takeover sets it"))
	}
	return invalid(errs)
}

// checkTransitions admits on a takeover a count of leader transitions
// that stays as it was or grows by one: the count is a history, which no
// holder may rewrite.
func checkTransitions(old, obj *locksv1alpha1.QueenLock) error {
	if d := int64(obj.Spec.LeaderTransitions) - int64(old.Spec.LeaderTransitions); d != 0 && d != 1 {
		return invalid(field.ErrorList{field.Invalid(specPath.Child("leaderTransitions"), obj.Spec.LeaderTransitions,
			fmt.Sprintf("a takeover keeps it (%d) or adds one", old.Spec.LeaderTransitions))})
	}
	return nil
}

func heldBy(old *locksv1alpha1.QueenLock) error {
	return refuse(ReasonHeld, specPath.Child("owner"),
		fmt.Sprintf("permit %s of lock %q is held by %q until %s", old.Name, old.Spec.Lock, old.Spec.Owner, formatTime(old.Spec.ExpireTime)))
}

func stamp(obj *locksv1alpha1.QueenLock, now time.Time, acquire bool) {
	t := metav1.NewMicroTime(now.UTC().Truncate(time.Microsecond))
	exp := metav1.NewMicroTime(t.Add(time.Duration(obj.Spec.TTLSeconds) * time.Second))
	if acquire {
		a := t
		obj.Spec.AcquireTime = &a
	}
	obj.Spec.RenewTime = &t
	obj.Spec.ExpireTime = &exp
}

// validateCreateMeta refuses finalizers: a permit that lingers after its
// delete would keep its name taken, and so its lock, after a release. It
// refuses owner references too: the garbage collector would delete
// whichever permit has the name when the "owner" goes, a later holder's
// included, since references stay across holdings.
func validateCreateMeta(obj *locksv1alpha1.QueenLock) field.ErrorList {
	var errs field.ErrorList
	if len(obj.Finalizers) > 0 {
		errs = append(errs, field.Forbidden(field.NewPath("metadata", "finalizers"), "a permit may not carry finalizers"))
	}
	if len(obj.OwnerReferences) > 0 {
		errs = append(errs, field.Forbidden(field.NewPath("metadata", "ownerReferences"),
			"a permit may not have owners: the garbage collector would delete a later holder's permit with them"))
	}
	return errs
}

// validateImmutable refuses a new lock or slot: the object's name is
// made of them, and each slot is an object of its own.
func validateImmutable(old, obj *locksv1alpha1.QueenLock) field.ErrorList {
	var errs field.ErrorList
	if obj.Spec.Lock != old.Spec.Lock {
		errs = append(errs, field.Invalid(specPath.Child("lock"), obj.Spec.Lock, fmt.Sprintf("is immutable (%q): the lock and slot make the permit's name", old.Spec.Lock)))
	}
	if obj.Spec.Slot != old.Spec.Slot {
		errs = append(errs, field.Invalid(specPath.Child("slot"), obj.Spec.Slot, fmt.Sprintf("is immutable (%d): each slot is a permit of its own", old.Spec.Slot)))
	}
	return errs
}

// validateUpdate refuses every change that is not part of a transition:
// every write changes the token, so labels, annotations, finalizers and owner
// references stay as they were, and lock and slot never change.
func validateUpdate(old, obj *locksv1alpha1.QueenLock) error {
	errs := validateImmutable(old, obj)
	meta := field.NewPath("metadata")
	if !maps.Equal(obj.Labels, old.Labels) {
		errs = append(errs, field.Forbidden(meta.Child("labels"), "may not change: every write to a permit changes its token, so only lock transitions may write it"))
	}
	if !maps.Equal(obj.Annotations, old.Annotations) {
		errs = append(errs, field.Forbidden(meta.Child("annotations"), "may not change: every write to a permit changes its token, so only lock transitions may write it"))
	}
	if !slices.Equal(obj.Finalizers, old.Finalizers) {
		errs = append(errs, field.Forbidden(meta.Child("finalizers"), "may not change: a permit carries no finalizers"))
	}
	if !equality.Semantic.DeepEqual(obj.OwnerReferences, old.OwnerReferences) {
		errs = append(errs, field.Forbidden(meta.Child("ownerReferences"), "may not change"))
	}
	return invalid(errs)
}

func formatTime(t *metav1.MicroTime) string {
	if t == nil {
		return "(never stamped)"
	}
	return FormatTime(t.Time)
}

// FormatTime writes a permit time as the contract does: RFC 3339 in UTC with
// six fractional digits.
func FormatTime(t time.Time) string {
	return strings.Replace(t.UTC().Format("2006-01-02T15:04:05.000000Z07:00"), "+00:00", "Z", 1)
}
