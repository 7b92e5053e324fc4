package gate

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/permit/gatedpod"
)

// podWaiterTTL is the ttlSeconds of a gated pod's waiter. Nobody renews
// it and the sweep leaves it alone (it names its pod): the gate removes it
// when the pod is let in or leaves the line, on whichever replica leads.
const podWaiterTTL = 300

// line is a lock's line as the gate sees it: every waiter, in order, and
// the waiters of the gated pods by pod.
type line struct {
	all   []locksv1alpha1.QueenLockWaiter
	byPod map[types.UID]*locksv1alpha1.QueenLockWaiter
	// unseen are the pods whose waiters were created in this pass: the
	// cache the line was read from has not shown them yet, so it may not
	// show every waiter ahead of them either (a route call that joined a
	// moment before). Such a pod waits until the cache shows its waiter,
	// whose create wakes the lock again: then it shows every earlier one.
	unseen map[types.UID]bool
}

// lineUp puts each waiting pod of the lock in the lock's line, in the
// order the pods were queued, where it has no waiter yet; it removes the
// waiters of pods that no longer wait (let in, deleted, gone). A pod thus
// takes its place among the route's and the handles' waiters when the
// leader first sees it waiting: a new leader keeps the places the pods
// had, since their waiters outlive it. Among themselves the pods keep the
// order of queued-at, as before the line: a pod waits behind the waiters
// of other kinds ahead of its own waiter, and behind the pods queued
// before it.
func (l *Line) lineUp(ctx context.Context, ns, lock string, waiting []*corev1.Pod) (line, error) {
	var list locksv1alpha1.QueenLockWaiterList
	if err := l.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{permit.LockLabel: permit.LabelValue(lock)}); err != nil {
		return line{}, fmt.Errorf("reading the line of lock %q: %w", lock, err)
	}
	// A pod that waits for other gates, or whose admission was just
	// refused, holds nobody back: it is not in the line meanwhile.
	now := l.Clock.Now()
	wanted := make(map[types.UID]bool, len(waiting))
	var lining []*corev1.Pod
	for _, pod := range waiting {
		if gatedpod.OnlyOurGate(pod) && !l.refusedRecently(pod, now) {
			wanted[pod.UID] = true
			lining = append(lining, pod)
		}
	}
	var all []locksv1alpha1.QueenLockWaiter
	have := map[types.UID]bool{}
	for _, w := range list.Items {
		if w.Spec.Lock != lock || !w.DeletionTimestamp.IsZero() {
			continue
		}
		if w.Spec.Pod != nil {
			uid := types.UID(w.Spec.Pod.UID)
			if !wanted[uid] || have[uid] {
				// Its pod no longer waits, or it is a second waiter of one
				// pod (a create the cache had not shown yet): it leaves.
				if err := l.leave(ctx, &w); err != nil {
					return line{}, err
				}
				continue
			}
			have[uid] = true
		}
		all = append(all, w)
	}
	unseen := map[types.UID]bool{}
	for _, pod := range lining {
		if have[pod.UID] {
			continue
		}
		w, err := l.join(ctx, lock, pod)
		if err != nil {
			return line{}, err
		}
		all = append(all, *w)
		unseen[pod.UID] = true
	}
	locks.SortLine(all)
	ln := line{all: all, byPod: map[types.UID]*locksv1alpha1.QueenLockWaiter{}, unseen: unseen}
	for i := range ln.all {
		if p := ln.all[i].Spec.Pod; p != nil {
			ln.byPod[types.UID(p.UID)] = &ln.all[i]
		}
	}
	return ln, nil
}

// join creates the waiter of a gated pod.
func (l *Line) join(ctx context.Context, lock string, pod *corev1.Pod) (*locksv1alpha1.QueenLockWaiter, error) {
	ask, _ := gatedpod.ParseAsk(pod.Annotations)
	since := metav1.NewMicroTime(gatedpod.QueuedAtTime(pod))
	if since.IsZero() {
		since = metav1.NewMicroTime(l.Clock.Now())
	}
	w := &locksv1alpha1.QueenLockWaiter{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    pod.Namespace,
			GenerateName: "pod-" + truncate(pod.Name, 40) + "-",
			Labels:       map[string]string{permit.LockLabel: permit.LabelValue(lock)},
		},
		Spec: locksv1alpha1.QueenLockWaiterSpec{
			Lock: lock, Owner: gatedpod.Owner(pod), Limit: int32(max(ask.Limit, 1)), TTLSeconds: podWaiterTTL,
			Carrier: "gate", Since: &since,
			Pod: &locksv1alpha1.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID)},
		},
	}
	if err := l.Client.Create(ctx, w); err != nil {
		return nil, fmt.Errorf("putting pod %s in the line of lock %q: %w", pod.Name, lock, err)
	}
	return w, nil
}

// leave removes a waiter from the line.
func (l *Line) leave(ctx context.Context, w *locksv1alpha1.QueenLockWaiter) error {
	uid := w.UID
	err := l.Client.Delete(ctx, w, client.Preconditions{UID: &uid})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("taking waiter %s out of the line of lock %q: %w", w.Name, w.Spec.Lock, err)
	}
	return nil
}

// behind tells whether a waiter that is not a gated pod's (a route call, a
// handle) is ahead of pod in the line: the pod waits for it. The gated
// pods ahead of it are the admit loop's to weigh.
func (ln line) behind(pod *corev1.Pod) bool {
	mine := ln.byPod[pod.UID]
	if mine == nil {
		return false
	}
	me := locks.LineKey(mine)
	return slices.ContainsFunc(ln.all, func(w locksv1alpha1.QueenLockWaiter) bool {
		return w.Spec.Pod == nil && locks.LineKey(&w) < me
	})
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
