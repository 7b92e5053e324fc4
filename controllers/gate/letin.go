package gate

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
	if wasRefused(pod) {
		l.setCondition(ctx, pod, corev1.ConditionTrue, "Admitted", fmt.Sprintf("holds lock %q slot %s", pod.Annotations[gatedpod.LockAnnotation], pod.Annotations[gatedpod.SlotAnnotation]), now)
	}
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
// the delete at the ttl), at most a year, the longest a permit lives; or
// a year for a pod without a ttl, whose permit is freed when the pod
// ends. It counts in whole seconds: a grace period is any int64 of
// seconds, and as a Duration (nanoseconds) 1e10 of them would overflow.
func ttlSeconds(pod *corev1.Pod, ask gatedpod.Ask) int64 {
	if ask.TTL == 0 {
		return permit.MaxTTLSeconds
	}
	grace := int64(defaultTerminationGrace / time.Second)
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = min(max(*g, 0), permit.MaxTTLSeconds)
	}
	return min(int64(ask.TTL/time.Second)+grace, permit.MaxTTLSeconds)
}

// AdmittedCondition is the pod condition that tells a gated pod why it
// could not be let in (status False), and that it was let in after all
// (True), written only on pods that were once refused.
const AdmittedCondition corev1.PodConditionType = "locks.queen.dev/Admitted"

// refusedRecently tells whether the pod's admission was refused less than
// retryLater ago: it is passed over until then, holding nobody back.
func (l *Line) refusedRecently(pod *corev1.Pod, now time.Time) bool {
	at, ok := l.refused.Load(pod.UID)
	if !ok {
		return false
	}
	if now.Sub(at.(time.Time)) < retryLater {
		return true
	}
	l.refused.Delete(pod.UID)
	return false
}

// notAdmitted tells a pod that could not be let in why, with a warning
// event and its Admitted condition, and passes it over for retryLater.
func (l *Line) notAdmitted(ctx context.Context, pod *corev1.Pod, now time.Time, why string) {
	l.refused.Store(pod.UID, now)
	refusals.WithLabelValues(pod.Namespace).Inc()
	note := "cannot be let in: " + why + fmt.Sprintf("; the pods behind it go on, and it is tried again in %s", retryLater)
	logf.FromContext(ctx).Info("gated pod not admitted", "pod", pod.Name, "namespace", pod.Namespace, "why", why)
	l.event(pod, corev1.EventTypeWarning, "NotAdmitted", "%s", note)
	l.setCondition(ctx, pod, corev1.ConditionFalse, "NotAdmitted", note, now)
}

// setCondition writes the pod's Admitted condition, unless it says that
// already. A failure is logged, not returned: the event says the same.
func (l *Line) setCondition(ctx context.Context, pod *corev1.Pod, status corev1.ConditionStatus, reason, message string, now time.Time) {
	for _, c := range pod.Status.Conditions {
		if c.Type == AdmittedCondition && c.Status == status && c.Reason == reason && c.Message == message {
			return
		}
	}
	const maxMessage = 1024
	if len(message) > maxMessage {
		message = strings.ToValidUTF8(message[:maxMessage], "") + "..."
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.PodCondition{{
		Type: AdmittedCondition, Status: status, Reason: reason, Message: message, LastTransitionTime: metav1.NewTime(now),
	}}}})
	if err == nil {
		err = l.Client.Status().Patch(ctx, pod.DeepCopy(), client.RawPatch(types.StrategicMergePatchType, patch))
	}
	if client.IgnoreNotFound(err) != nil {
		logf.FromContext(ctx).Error(err, "telling a gated pod with its condition", "pod", pod.Name, "namespace", pod.Namespace, "reason", reason)
	}
}

// wasRefused tells whether the pod carries an Admitted condition that is
// not True: it was told it could not be let in.
func wasRefused(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == AdmittedCondition {
			return c.Status != corev1.ConditionTrue
		}
	}
	return false
}
