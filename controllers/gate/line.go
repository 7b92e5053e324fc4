// Package gate is the gated pods' line: on the leader, it takes the lock for
// the waiting gated pods of each lock in the order they were queued, as slots
// free, and lets each in with one patch that lifts its scheduling gate and
// hands it its token. The pod webhook that gates them at create is in package
// webhook; what both read is in permit/gatedpod.
package gate

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit/gatedpod"
)

// The manager lets gated pods in: it lifts the gate, deletes a pod past its
// ttl and lowers its activeDeadlineSeconds. Those rights (patch and delete
// on pods) are in config/gate/role.yaml, installed only with gated pods,
// and the admission policy queen-locks-gated-pods-manager allows the
// manager nothing else on pods.

// lockIndex indexes the cached gated pods by the lock they name.
const lockIndex = "locks.queen.dev/gate-lock"

// defaultTerminationGrace is the API's default terminationGracePeriodSeconds.
const defaultTerminationGrace = 30 * time.Second

// Line admits the gated pods of each lock in the order they were queued, as
// slots free. It runs on the leader only, so one process decides for a
// lock at a time; a new leader rebuilds every line from the pods, since
// the line is nothing but the gated pods and their queued-at.
//
// A reconcile is one lock of one namespace (the request's Name is the lock).
// It is woken by the lock's gated pods changing and by any permit of the
// lock being deleted (a slot freed) while the lock has gated pods, so a
// gated pod competes with the route's waiters like one more waiter.
type Line struct {
	// Client reads gated pods from the manager's cache (which holds only
	// labelled pods) and writes pods directly.
	Client client.Client
	Core   kubernetes.Interface
	Locks  *locks.Client // over a client that reads the API server itself
	// Held reads the lock's holders from the manager's cache, to skip an
	// attempt that can only fail: when every slot is held by others, the
	// delete that frees one wakes the line again. Nil always attempts.
	Held  *locks.Client
	Clock clock.PassiveClock
	// Grace is the expiry grace: a permit past its expireTime by this much
	// may be taken over, and the line looks again then, as the route's
	// waiters do, rather than waiting for the expiry controller's delete.
	Grace time.Duration
	// Recorder writes core events: a waiting pod's place changes under the
	// same reason, and the events.k8s.io recorder would fold those into a
	// series that keeps the first note, the place it no longer has; the
	// core recorder keeps the latest message.
	Recorder record.EventRecorder

	mu sync.Mutex
	// told is, per lock, what each waiting pod was last told (its place in
	// line), so that an event is written only when it changes.
	told map[types.NamespacedName]map[types.UID]string
	// unscheduled holds the admitted pods told they hold a slot unscheduled.
	unscheduled sync.Map
	// refused holds, per pod, when its admission was last refused: it is
	// passed over until retryLater after.
	refused sync.Map
}

// SetupWithManager registers the line with the manager.
func (l *Line) SetupWithManager(mgr ctrl.Manager) error {
	l.told = map[types.NamespacedName]map[types.UID]string{}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, lockIndex, func(o client.Object) []string {
		if lock, ok := o.GetAnnotations()[gatedpod.LockAnnotation]; ok {
			return []string{lock}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing gated pods by lock: %w", err)
	}
	podToLock := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		lock, ok := o.GetAnnotations()[gatedpod.LockAnnotation]
		if !ok || o.GetLabels()[gatedpod.Label] != gatedpod.LabelValue {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: lock}}}
	})
	permitToLock := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		p, ok := o.(*locksv1alpha1.QueenLock)
		if !ok || !l.hasGatedPods(ctx, p.Namespace, p.Spec.Lock) {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Spec.Lock}}}
	})
	waiterToLock := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if w, ok := o.(*locksv1alpha1.QueenLockWaiter); ok {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: w.Namespace, Name: w.Spec.Lock}}}
		}
		return nil
	})
	// Only a deleted permit frees a slot: renews, which are most permit
	// events, wake nothing. An expired permit may be taken over before the
	// expiry controller deletes it: the line looks again at the soonest
	// expiry of a full lock's holders (Reconcile's RequeueAfter).
	freed := predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		UpdateFunc:  func(event.UpdateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return true },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("gate").
		Watches(&corev1.Pod{}, podToLock, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.GetLabels()[gatedpod.Label] == gatedpod.LabelValue
		}))).
		Watches(&locksv1alpha1.QueenLock{}, permitToLock, builder.WithPredicates(freed)).
		// A waiter that leaves the line may let the pods behind it move,
		// and a gated pod's new waiter, once the cache shows it, lets that
		// pod be weighed against every waiter ahead of it.
		Watches(&locksv1alpha1.QueenLockWaiter{}, waiterToLock, builder.WithPredicates(predicate.Funcs{
			CreateFunc: func(e event.CreateEvent) bool {
				w, ok := e.Object.(*locksv1alpha1.QueenLockWaiter)
				return ok && w.Spec.Pod != nil
			},
			UpdateFunc:  func(event.UpdateEvent) bool { return false },
			DeleteFunc:  func(event.DeleteEvent) bool { return true },
			GenericFunc: func(event.GenericEvent) bool { return false },
		})).
		Complete(l)
}

// hasGatedPods tells whether the cache holds a gated pod of lock in ns. A
// slot freed of a lock without one has nobody of the line's to let in:
// most permits are the route's and the handles', and their deletes need
// no pass of the line. A gated pod the cache shows only later wakes the
// line by its own event, which then finds the slot free; a pod waiter
// left behind by a pod that went is removed on that pod's delete, or on
// the waiter's own create when a new leader lists them. Read without a
// copy: only the count is looked at.
func (l *Line) hasGatedPods(ctx context.Context, ns, lock string) bool {
	var list corev1.PodList
	if err := l.Client.List(ctx, &list, append(gatedPodsOf(ns, lock), client.UnsafeDisableDeepCopy)...); err != nil {
		return true // not known: let the reconcile look
	}
	return len(list.Items) > 0
}

// gatedPodsOf selects, in the manager's cache, the gated pods of lock in
// ns: what the line weighs, and what hasGatedPods counts.
func gatedPodsOf(ns, lock string) []client.ListOption {
	return []client.ListOption{client.InNamespace(ns), client.MatchingLabels{gatedpod.Label: gatedpod.LabelValue}, client.MatchingFields{lockIndex: lock}}
}

// Reconcile brings one lock's line forward.
func (l *Line) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ns, lock := req.Namespace, req.Name
	var list corev1.PodList
	if err := l.Client.List(ctx, &list, gatedPodsOf(ns, lock)...); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing gated pods of lock %q: %w", lock, err)
	}
	now := l.Clock.Now()
	var waiting []*corev1.Pod
	var next time.Duration // the soonest ttl to act on
	var holdErrs []error
	for i := range list.Items {
		pod := &list.Items[i]
		if _, err := gatedpod.ParseAsk(pod.Annotations); err != nil {
			continue // refused at create; cannot be changed since
		}
		switch {
		case gatedpod.Gated(pod):
			if pod.DeletionTimestamp == nil {
				waiting = append(waiting, pod)
			}
		case pod.Annotations[gatedpod.TokenAnnotation] != "":
			after, err := l.holding(ctx, pod, now)
			if err != nil {
				// One holder's trouble does not hold the line up: the
				// error comes back after the admissions, for a retry.
				holdErrs = append(holdErrs, err)
				continue
			}
			if after > 0 && (next == 0 || after < next) {
				next = after
			}
		}
	}
	sort.Slice(waiting, func(i, j int) bool {
		a, b := gatedpod.QueuedAtTime(waiting[i]), gatedpod.QueuedAtTime(waiting[j])
		if !a.Equal(b) {
			return a.Before(b)
		}
		return waiting[i].UID < waiting[j].UID
	})
	ln, err := l.lineUp(ctx, ns, lock, waiting)
	if err != nil {
		return ctrl.Result{}, err
	}
	told := l.toldOf(req.NamespacedName, waiting)
	retry, expires, err := l.admit(ctx, lock, waiting, told, ln)
	if err := errors.Join(append(holdErrs, err)...); err != nil {
		return ctrl.Result{}, err
	}
	if !expires.IsZero() {
		// Just past the moment a takeover is allowed.
		after := max(expires.Add(l.Grace).Sub(now), 0) + takeoverMargin
		if next == 0 || after < next {
			next = after
		}
	}
	// Nothing of this lock changes when a ServiceAccount regains its rights
	// or a quota makes room: look again.
	if retry && (next == 0 || next > retryLater) {
		next = retryLater
	}
	return ctrl.Result{RequeueAfter: next}, nil
}

// toldOf is what the waiting pods of one lock were last told, without the
// pods that left the line since.
func (l *Line) toldOf(key types.NamespacedName, waiting []*corev1.Pod) map[types.UID]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	old := l.told[key]
	if len(waiting) == 0 {
		delete(l.told, key)
		return map[types.UID]string{}
	}
	told := make(map[types.UID]string, len(waiting))
	for _, pod := range waiting {
		if s, ok := old[pod.UID]; ok {
			told[pod.UID] = s
		}
	}
	l.told[key] = told
	return told
}

// takeoverMargin is how long after an expired permit may be taken over the
// line tries: the webhook decides by its own reading of the clock.
const takeoverMargin = 50 * time.Millisecond

// retryLater is how soon a line held up by something outside the lock (a
// pod's missing rights, a full ResourceQuota) is looked at again.
const retryLater = 10 * time.Second

// admit lets waiting pods in, in order, while slots are free; then tells
// the rest where they stand. A pod waits behind the pods before it only
// for the slots they wait for: a pod of limit N takes slots 0 to N-1, so
// one that waits for all of them holds back the pods after it whose limit
// is at most N, not those with room above it. A pod that cannot be let in
// (its admission refused) is told why and gives back what it took; it
// holds nobody back, and is tried again after retryLater. retry: a pod
// waits on something no event of this lock announces; expires: a pod
// waits for a full lock whose soonest holder's permit expires then.
func (l *Line) admit(ctx context.Context, lock string, waiting []*corev1.Pod, told map[types.UID]string, ln line) (retry bool, expires time.Time, err error) {
	log := logf.FromContext(ctx)
	place := 0
	var holders []locks.Holder
	// Every slot below fullBelow is held by others; quota: a new permit
	// does not fit in the namespace.
	fullBelow, quota := 0, false
	full := func(limit int, hs []locks.Holder, q bool) {
		fullBelow, holders, quota = max(fullBelow, limit), hs, quota || q
		if e := soonest(hs); !e.IsZero() && (expires.IsZero() || e.Before(expires)) {
			expires = e
		}
	}
	tell := func(pod *corev1.Pod, reason, note string) {
		l.mu.Lock()
		same := told[pod.UID] == reason+": "+note
		told[pod.UID] = reason + ": " + note
		l.mu.Unlock()
		if !same {
			l.event(pod, corev1.EventTypeNormal, reason, "%s", note)
		}
	}
	// A pod far back in a long line is told its place at every tenth, then
	// at each of the last ten: the API server's client lets an object have
	// 25 events in a burst, and the Admitted event must not be the one
	// dropped.
	waitingAt := func(pod *corev1.Pod, place int, holders []locks.Holder, quota bool) {
		l.mu.Lock()
		_, before := told[pod.UID]
		l.mu.Unlock()
		if before && place > 10 && place%10 != 0 {
			return
		}
		tell(pod, "Waiting", waitingNote(place, lock, holders, quota))
	}
	now := l.Clock.Now()
	for _, pod := range waiting {
		ns := pod.Namespace
		ask, _ := gatedpod.ParseAsk(pod.Annotations)
		if l.refusedRecently(pod, now) {
			retry = true
			continue
		}
		if ln.unseen[pod.UID] {
			// Its place is new: wait for the cache to show it, and hold
			// the pods after it back from the slots it waits for.
			fullBelow = max(fullBelow, ask.Limit)
			place++
			waitingAt(pod, place, holders, quota)
			continue
		}
		if quota || ask.Limit <= fullBelow || ln.behind(pod) {
			if holds(holders, gatedpod.Owner(pod)) {
				continue // let in already; the cache has yet to show it
			}
			place++
			waitingAt(pod, place, holders, quota)
			continue
		}
		if !gatedpod.OnlyOurGate(pod) {
			tell(pod, "OtherGates", fmt.Sprintf("waits for its other scheduling gates to be removed before it queues for lock %q", lock))
			continue
		}
		if l.Held != nil {
			// Woken by the lock's pods changing (an admitted pod's own
			// patch, a holder's status turning Succeeded before its permit
			// goes), the slots are often all still held: no reviews, no
			// create that the API server would refuse.
			held, err := l.Held.Get(ctx, ns, lock)
			if below := within(held, ask.Limit); err == nil && len(below) >= ask.Limit && !holds(held, gatedpod.Owner(pod)) {
				full(ask.Limit, below, false)
				place++
				waitingAt(pod, place, holders, false)
				continue
			}
		}
		sa := pod.Spec.ServiceAccountName
		if sa == "" {
			sa = "default"
		}
		// The right to hold is checked again now: a RoleBinding removed
		// while the pod waited takes effect here.
		missing, err := gatedpod.Entitled(ctx, l.Core, ns, sa)
		if err != nil {
			return retry, expires, fmt.Errorf("checking whether ServiceAccount %s/%s may hold locks: %w", ns, sa, err)
		}
		if missing != "" {
			retry = true
			tell(pod, "NotEntitled", fmt.Sprintf("ServiceAccount %q may no longer %s queenlocks in %q: the pod stays gated until it may", sa, missing, ns))
			continue
		}
		got, err := l.Locks.Acquire(ctx, ns, lock, gatedpod.Owner(pod), ttlSeconds(pod, ask), ask.Limit,
			locks.HolderPod(pod.Namespace, pod.Name, string(pod.UID)), locks.Queued())
		if err != nil {
			if transient(err) {
				return retry, expires, fmt.Errorf("acquiring lock %q for pod %s: %w", lock, pod.Name, err)
			}
			retry = true
			l.notAdmitted(ctx, pod, now, fmt.Sprintf("taking lock %q for it was refused: %v", lock, err))
			continue
		}
		if !got.Acquired {
			full(ask.Limit, got.Holders, got.Reason == locks.ReasonQuota)
			retry = retry || quota
			place++
			waitingAt(pod, place, holders, quota)
			continue
		}
		if err := l.letIn(ctx, pod, ask, got.Permit); err != nil {
			if transient(err) {
				return retry, expires, err
			}
			// The pod will not run on this permit: give it back, that
			// version alone, so that the slot goes to the next in line.
			if _, gerr := l.Locks.GiveBack(ctx, ns, lock, got.Slot, got.Token); gerr != nil {
				return retry, expires, fmt.Errorf("giving back lock %q slot %d of pod %s, which could not be let in (%w): %w", lock, got.Slot, pod.Name, err, gerr)
			}
			retry = true
			l.notAdmitted(ctx, pod, now, fmt.Sprintf("it held lock %q slot %d, given back, but lifting its gate was refused: %v", lock, got.Slot, err))
			continue
		}
		log.Info("gated pod admitted", "lock", lock, "slot", got.Slot, "token", got.Token, "pod", pod.Name)
		if w := ln.byPod[pod.UID]; w != nil {
			if err := l.leave(ctx, w); err != nil {
				return retry, expires, err
			}
		}
	}
	return retry, expires, nil
}

// within is the holders on slots below limit: the slots a pod of that
// limit may take. Permits on slots above are other limits' and leave its
// slots free.
func within(holders []locks.Holder, limit int) []locks.Holder {
	var in []locks.Holder
	for _, h := range holders {
		if h.Slot < limit {
			in = append(in, h)
		}
	}
	return in
}

// transient tells whether an error of the API server may pass when the
// same write is sent again (a timeout, an overloaded or restarting server,
// a connection lost): the line then tries again, in the same order. Any
// other refusal is the pod's own, and holds only that pod back.
func transient(err error) bool {
	switch {
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsForbidden(err),
		apierrors.IsRequestEntityTooLargeError(err), apierrors.IsMethodNotSupported(err), apierrors.IsNotAcceptable(err),
		apierrors.IsUnsupportedMediaType(err):
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code == 0 || code >= 500 || code == 429 || code == 409
	}
	return true
}

func soonest(holders []locks.Holder) time.Time {
	var t time.Time
	for _, h := range holders {
		if !h.ExpiresAt.IsZero() && (t.IsZero() || h.ExpiresAt.Before(t)) {
			t = h.ExpiresAt
		}
	}
	return t
}

// holds tells whether owner is among holders.
func holds(holders []locks.Holder, owner string) bool {
	for _, h := range holders {
		if h.Owner == owner {
			return true
		}
	}
	return false
}

func waitingNote(place int, lock string, holders []locks.Holder, quota bool) string {
	who := "its holders"
	if len(holders) == 1 {
		who = fmt.Sprintf("%q (slot %d, token %d)", holders[0].Owner, holders[0].Slot, holders[0].Token)
	} else if len(holders) > 1 {
		who = fmt.Sprintf("%d holders", len(holders))
	}
	note := fmt.Sprintf("number %d in line for lock %q, held by %s", place, lock, who)
	if quota {
		note += "; a new permit would be needed and the namespace's ResourceQuota has no room for one"
	}
	return note
}

// unschedulable tells, once per replica, that an admitted pod holds its
// slot while the scheduler finds no node for it.
func (l *Line) unschedulable(pod *corev1.Pod) {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			if _, told := l.unscheduled.LoadOrStore(pod.UID, true); !told {
				l.event(pod, corev1.EventTypeWarning, "HoldsSlotUnscheduled", "holds lock %q slot %s but no node can run it yet: the slot stays taken until it runs and ends, or is deleted", pod.Annotations[gatedpod.LockAnnotation], pod.Annotations[gatedpod.SlotAnnotation])
			}
			return
		}
	}
}

func (l *Line) event(pod *corev1.Pod, kind, reason, note string, args ...any) {
	if l.Recorder != nil {
		l.Recorder.Eventf(pod, kind, reason, note, args...)
	}
}
