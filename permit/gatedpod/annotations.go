// Package gatedpod holds what both halves of gated pods read: the label that
// opts a pod in, the annotations that name its lock, limit and ttl, the ones
// the manager stamps on it, and whether its ServiceAccount may hold locks. A
// pod labelled locks.queen.dev/gate: "true" waits at a scheduling gate until
// the manager takes its lock for it: the pod webhook (package webhook) checks
// and gates it at create, and the line (package controllers/gate), on the
// leader, lets it in as slots free. The permit names the pod, so the holder
// pod follower frees it when the pod ends, as it does for any holder pod.
package gatedpod

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/queen-locks/queen-locks/permit"
)

// The label and annotations of a gated pod. Everything under the
// locks.queen.dev/ prefix on a labelled pod is the manager's to change; the
// admission policies refuse anyone else's change to it.
const (
	Label      = "locks.queen.dev/gate"
	LabelValue = "true"
	// Gate is the scheduling gate, and also the annotation naming the lock.
	Gate = "locks.queen.dev/lock"

	LockAnnotation  = "locks.queen.dev/lock"
	LimitAnnotation = "locks.queen.dev/limit"
	TTLAnnotation   = "locks.queen.dev/ttl"
	// QueuedAt is stamped by the webhook with the server's time: the line's
	// order. creationTimestamp has whole seconds, so the pods of one
	// schedule would tie.
	QueuedAt = "locks.queen.dev/queued-at"
	// TokenAnnotation and SlotAnnotation are set when the pod is let in;
	// a container reads the token through the downward API.
	TokenAnnotation = "locks.queen.dev/token"
	SlotAnnotation  = "locks.queen.dev/slot"
	// AdmittedAt is when the pod's hold began: for a pod with a ttl, when
	// its permit's lifetime began (the ttl counts from there, so the pod
	// never outlives its permit); else when the manager let it in.
	AdmittedAt = "locks.queen.dev/admitted-at"
)

// TimeFormat is the format of queued-at and admitted-at: UTC to the
// microsecond, so that it sorts as text too.
const TimeFormat = "2006-01-02T15:04:05.000000Z"

// MinTTL and MaxTTL bound the ttl annotation.
const (
	MinTTL = time.Second
	MaxTTL = permit.MaxTTLSeconds * time.Second
)

// MaxAnnotations is the most annotations a gated pod may carry at create:
// the manager's admission policy compares a pod's annotations one by one
// when it lets the pod in, and CEL stops an expression past a cost that
// about 10 per annotation reaches near 100,000 of them (config/gate).
const MaxAnnotations = 10000

// Ask is what a gated pod asks for.
type Ask struct {
	Lock  string
	Limit int
	// TTL is how long the pod may hold the lock; 0 for as long as it lives.
	TTL time.Duration
}

// Labelled says whether the pod opted in.
func Labelled(pod *corev1.Pod) bool { return pod.Labels[Label] == LabelValue }

// ParseAsk reads a labelled pod's annotations, naming the annotation at
// fault when one is wrong.
func ParseAsk(annotations map[string]string) (Ask, error) {
	a := Ask{Limit: 1}
	lock, ok := annotations[LockAnnotation]
	if !ok {
		return a, fmt.Errorf("annotation %s is required on a pod labelled %s=%q: it names the lock the pod waits for", LockAnnotation, Label, LabelValue)
	}
	if err := permit.ValidateName(lock); err != nil {
		return a, fmt.Errorf("annotation %s: %w", LockAnnotation, err)
	}
	a.Lock = lock
	if s, ok := annotations[LimitAnnotation]; ok {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return a, fmt.Errorf("annotation %s: %q is not a whole number", LimitAnnotation, printable(s))
		}
		if err := permit.ValidateLimit(n); err != nil {
			return a, fmt.Errorf("annotation %s: %w", LimitAnnotation, err)
		}
		a.Limit = int(n)
	}
	if s, ok := annotations[TTLAnnotation]; ok {
		d, err := time.ParseDuration(s)
		if err != nil {
			return a, fmt.Errorf("annotation %s: %q is not a duration such as 90s, 30m or 2h", TTLAnnotation, printable(s))
		}
		if d < MinTTL || d > MaxTTL || d%time.Second != 0 {
			return a, fmt.Errorf("annotation %s: must be whole seconds from %s to %s (a year), got %s", TTLAnnotation, MinTTL, MaxTTL, s)
		}
		a.TTL = d
	}
	return a, nil
}

// Prefix begins every label and annotation of a gated pod that the
// manager reads or writes.
const Prefix = "locks.queen.dev/"

// known are the annotations under Prefix a gated pod may carry: what it
// asks for, what the manager stamps on it, and the guard's, for a pod of
// a guarded kind.
var known = []string{LockAnnotation, LimitAnnotation, TTLAnnotation, QueuedAt, TokenAnnotation, SlotAnnotation, AdmittedAt,
	permit.GuardAnnotation, permit.FenceAnnotation, permit.DeletableAnnotation, permit.OverrideAnnotation, permit.RaiseAnnotation}

// CheckUnknown names an annotation under Prefix that the manager does not
// read: a misspelt ttl or limit would otherwise be ignored without a word,
// and the pod hold its lock for as long as it lives, or wait for the wrong
// number of slots. The webhook asks it of a pod at create.
func CheckUnknown(annotations map[string]string) error {
	var unknown []string
	for k := range annotations {
		if strings.HasPrefix(k, Prefix) && !slices.Contains(known, k) {
			unknown = append(unknown, printable(k))
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	return fmt.Errorf("annotation %s is not one queen-locks reads: a pod labelled %s=%q may ask with %s, %s and %s",
		strings.Join(unknown, ", "), Label, LabelValue, LockAnnotation, LimitAnnotation, TTLAnnotation)
}

// printable keeps an error message readable whatever the annotation held.
func printable(s string) string {
	const max = 64
	if len(s) > max {
		s = s[:max] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}

// Gated says whether the pod still waits at our gate.
func Gated(pod *corev1.Pod) bool {
	for _, g := range pod.Spec.SchedulingGates {
		if g.Name == Gate {
			return true
		}
	}
	return false
}

// OnlyOurGate says whether our gate is the pod's last: the line acquires
// only for such pods, since lifting ours would not let the pod run while
// another gate holds it, and the slot would be held for nothing.
func OnlyOurGate(pod *corev1.Pod) bool {
	return len(pod.Spec.SchedulingGates) == 1 && pod.Spec.SchedulingGates[0].Name == Gate
}

// Owner is the owner a gated pod's permit is held by.
func Owner(pod *corev1.Pod) string { return permit.GateOwnerPrefix + string(pod.UID) }

// Finished says whether the pod's containers are done for good.
func Finished(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// QueuedAtTime is when the pod joined the line. A pod without the annotation
// (it cannot be, unless written before the webhook stamped it) queues by
// its creation time.
func QueuedAtTime(pod *corev1.Pod) time.Time {
	if t, err := time.Parse(TimeFormat, pod.Annotations[QueuedAt]); err == nil {
		return t
	}
	return pod.CreationTimestamp.Time
}
