package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/queen-locks/queen-locks/permit/gatedpod"
)

// Shapes of gated pods beyond the plain one, which the gated clients
// carry now and then: each is a pod the line once handled wrongly, and
// must now admit like any other.
const (
	// ShapeLimitOne asks the semaphore with limit 1: it may take slot 0
	// only, and is let in whenever slot 0 is free, whoever holds the
	// slots above it.
	ShapeLimitOne = "limit-1"
	// ShapeHugeGrace carries a ttl and a terminationGracePeriodSeconds of
	// 1e10: the permit's lifetime (ttl plus grace) must be counted without
	// overflow, and capped at a year.
	ShapeHugeGrace = "huge-grace"
	// ShapeManyAnnotations carries 1,500 ordinary annotations (issue 41):
	// the admission policy that checks the manager's patch must not run
	// out of CEL cost on it, or the pod holds its slot and is never let in.
	ShapeManyAnnotations = "many-annotations"
	// ShapeUnadmittable is created with a second scheduling gate of the
	// client's, which the client then lifts in the patch that gives the
	// pod overflowAnnotations ordinary annotations: more than the
	// manager's admission policy compares (docs/gated-pods.md, "Admitted").
	// The manager cannot let it in: it must say why (the pod's condition
	// locks.queen.dev/Admitted False) and pass it over, holding nobody
	// back (line_check.go).
	ShapeUnadmittable = "unadmittable"
)

// manyAnnotations and overflowAnnotations are the ordinary annotations of
// ShapeManyAnnotations and ShapeUnadmittable.
const (
	manyAnnotations     = 1500
	overflowAnnotations = 10100
)

// laterGate is ShapeUnadmittable's own scheduling gate: the pod joins the
// line only once it is gone.
const laterGate = "chaos.queen.dev/later"

// shapes are the shapes a gated client picks from, the plain one ("")
// most often.
var shapes = []string{"", "", "", ShapeLimitOne, ShapeHugeGrace, ShapeManyAnnotations, ShapeUnadmittable}

// hugeGrace is ShapeHugeGrace's terminationGracePeriodSeconds.
const hugeGrace int64 = 1e10

// shapePod gives pod, a gated pod of lock, the shape; it answers the
// limit the pod asks.
func shapePod(pod *corev1.Pod, lock, shape string) int {
	limit := 1
	if lock == Semaphore {
		limit = SemaphoreLimit
	}
	switch shape {
	case ShapeLimitOne:
		limit = 1
	case ShapeHugeGrace:
		pod.Annotations[gatedpod.TTLAnnotation] = "1h"
		g := hugeGrace
		pod.Spec.TerminationGracePeriodSeconds = &g
	case ShapeManyAnnotations:
		for i := range manyAnnotations {
			pod.Annotations["example.com/note-"+strconv.Itoa(i)] = "x"
		}
	case ShapeUnadmittable:
		pod.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: laterGate}}
	}
	if lock == Semaphore {
		pod.Annotations[gatedpod.LimitAnnotation] = strconv.Itoa(limit)
	}
	return limit
}

// checkShape checks what a hold's shape promises: a pod of limit N holds
// a slot below N, and a huge grace period leaves a permit of at most a
// year (never one that overflowed to the past, or to nothing).
func (r *Report) checkShape(x Hold, e Event) {
	r.Gated.Shapes[shapeName(x.Shape)]++
	if x.Limit > 0 && x.Slot >= x.Limit {
		r.violate(fmt.Sprintf("gated: %s asked limit %d but holds slot %d", x, x.Limit, x.Slot))
	}
	if x.Shape == ShapeHugeGrace {
		const year = int64(365 * 24 * 3600 * 1e9)
		if life := e.ExpireTime - e.RenewTime; life <= 0 || life > year+int64(1e9) {
			r.violate(fmt.Sprintf("gated: %s (ttl 1h, termination grace %d s) has a permit that lives %d ns: not within a year", x, hugeGrace, life))
		}
	}
}

func shapeName(s string) string {
	if s == "" {
		return "plain"
	}
	return strings.ToLower(s)
}

// overflowPatch is the merge patch that gives a ShapeUnadmittable pod its
// overflowAnnotations and lifts its own gate (leaving the manager's).
func overflowPatch() []byte {
	ann := make(map[string]string, overflowAnnotations)
	for i := range overflowAnnotations {
		ann["example.com/n-"+strconv.Itoa(i)] = "x"
	}
	b, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": ann},
		"spec":     map[string]any{"schedulingGates": []corev1.PodSchedulingGate{{Name: gatedpod.Gate}}},
	})
	return b
}
