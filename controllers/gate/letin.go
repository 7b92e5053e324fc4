package gate

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/permit/gatedpod"
)

// letIn lifts the gate and hands the pod its token, in one patch made
// against the version of the pod the line read: a pod changed since is read
// again, and its permit (ours, by owner) is found again as already held.
func (l *Line) letIn(ctx context.Context, pod *corev1.Pod, ask gatedpod.Ask, p locks.Permit) error {
	// The pod's ttl counts from when its permit's lifetime began, not from
	// this patch: a gate lifted late (a conflict, a new leader) must not
	// let the pod run past its permit, which lives the ttl plus the grace
	// period from its acquire.
	now := l.Clock.Now()
	start := now
	if ask.TTL > 0 {
		start = p.ExpiresAt.Add(-time.Duration(ttlSeconds(pod, ask)) * time.Second)
	}
	gates := make([]corev1.PodSchedulingGate, 0, len(pod.Spec.SchedulingGates))
	for _, g := range pod.Spec.SchedulingGates {
		if g.Name != gatedpod.Gate {
			gates = append(gates, g)
		}
	}
	patched := pod.DeepCopy()
	patched.Spec.SchedulingGates = gates
	patched.Annotations[gatedpod.TokenAnnotation] = strconv.FormatUint(p.Token, 10)
	patched.Annotations[gatedpod.SlotAnnotation] = strconv.Itoa(p.Slot)
	patched.Annotations[gatedpod.AdmittedAt] = start.UTC().Format(gatedpod.TimeFormat)
	err := l.Client.Patch(ctx, patched, client.MergeFromWithOptions(pod, client.MergeFromWithOptimisticLock{}))
	switch {
	case apierrors.IsNotFound(err):
		// Gone while we acquired: the permit names it, so the pod follower
		// frees the permit.
		return nil
	case apierrors.IsConflict(err):
		// The cache was behind the pod (often: our own earlier patch).
		// The newer version's event brings the lock back here, and the
		// permit, held by the pod's owner, is found again as already held.
		logf.FromContext(ctx).V(1).Info("gated pod changed since read; waiting for its newer version", "pod", pod.Name)
		return nil
	case err != nil:
		return fmt.Errorf("letting pod %s/%s in: %w", pod.Namespace, pod.Name, err)
	}
	admissions.WithLabelValues(pod.Namespace).Inc()
	admissionSeconds.WithLabelValues(pod.Namespace).Observe(now.Sub(gatedpod.QueuedAtTime(pod)).Seconds())
	l.event(patched, corev1.EventTypeNormal, "Admitted", "holds lock %q slot %d with token %d; scheduling gate removed", patched.Annotations[gatedpod.LockAnnotation], p.Slot, p.Token)
	return nil
}

// holding looks after an admitted pod: past its ttl the pod is deleted, and
// once it has started its activeDeadlineSeconds is lowered to what remains,
// so the kubelet stops it even if it cannot reach the API server. It
// answers how long until the ttl ends, 0 for nothing to wait for.
func (l *Line) holding(ctx context.Context, pod *corev1.Pod, now time.Time) (time.Duration, error) {
	if gatedpod.Finished(pod) || pod.DeletionTimestamp != nil {
		l.unscheduled.Delete(pod.UID)
		return 0, nil
	}
	l.unschedulable(pod)
	ask, _ := gatedpod.ParseAsk(pod.Annotations)
	if ask.TTL == 0 {
		return 0, nil
	}
	admitted, err := time.Parse(gatedpod.TimeFormat, pod.Annotations[gatedpod.AdmittedAt])
	if err != nil {
		return 0, nil // not let in by this manager; nothing to count from
	}
	deadline := admitted.Add(ask.TTL)
	if !now.Before(deadline) {
		uid := pod.UID
		err := l.Client.Delete(ctx, pod, client.Preconditions{UID: &uid})
		if client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
			return 0, fmt.Errorf("deleting pod %s/%s past its ttl: %w", pod.Namespace, pod.Name, err)
		}
		if err == nil {
			ttlDeletions.WithLabelValues(pod.Namespace).Inc()
			l.event(pod, corev1.EventTypeNormal, "TTLEnded", "held lock %q for its ttl of %s; deleted", ask.Lock, ask.TTL)
		}
		return 0, nil
	}
	if pod.Status.StartTime != nil {
		left := int64(math.Ceil(deadline.Sub(pod.Status.StartTime.Time).Seconds()))
		if left < 1 {
			left = 1
		}
		if ads := pod.Spec.ActiveDeadlineSeconds; ads == nil || *ads > left {
			patched := pod.DeepCopy()
			patched.Spec.ActiveDeadlineSeconds = &left
			// A conflict means the cache is behind: the newer pod's event
			// brings it back here.
			if err := l.Client.Patch(ctx, patched, client.MergeFromWithOptions(pod, client.MergeFromWithOptimisticLock{})); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
				return 0, fmt.Errorf("lowering activeDeadlineSeconds of pod %s/%s to its ttl: %w", pod.Namespace, pod.Name, err)
			}
		}
	}
	return deadline.Sub(now), nil
}

// ttlSeconds is the lifetime of a gated pod's permit: the ttl plus the
// pod's termination grace period (its containers may run that long after
// the delete at the ttl), or a year, the longest there is, for a pod
// without a ttl, whose permit is freed when the pod ends.
func ttlSeconds(pod *corev1.Pod, ask gatedpod.Ask) int64 {
	if ask.TTL == 0 {
		return permit.MaxTTLSeconds
	}
	grace := defaultTerminationGrace
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	return min(int64((ask.TTL+grace)/time.Second), permit.MaxTTLSeconds)
}

// waitingNote says where a waiting pod stands.
// soonest is the earliest expiry among holders; zero for none.
