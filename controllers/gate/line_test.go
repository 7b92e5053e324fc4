package gate_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/queen-locks/queen-locks/internal/metricstest"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit/gatedpod"
)

func TestGatedPodsAreLetInOneAtATimeInTheOrderTheyCame(t *testing.T) {
	ns := entitledNamespace(t)
	gated(t, ns, "first", "nightly")
	second := gated(t, ns, "second", "nightly")
	third := gated(t, ns, "third", "nightly")

	first := admitted(t, ns, "first")
	told(t, second, "Waiting", `number 1 in line for lock "nightly"`)
	told(t, third, "Waiting", `number 2 in line for lock "nightly"`)
	if got := running(t, ns); !slices.Equal(got, []string{"first"}) {
		t.Fatalf("let in: %v, want only first", got)
	}
	permitOf(t, first)

	ended := finish(t, first)
	t.Logf("permit freed %s after the first pod finished", freedWithin(t, first, ended, 2*time.Second))
	second = admitted(t, ns, "second")
	permitOf(t, second)
	told(t, third, "Waiting", `number 1 in line`)
	if got := running(t, ns); !slices.Equal(got, []string{"second"}) {
		t.Fatalf("let in: %v, want only second", got)
	}
	if token(t, second) <= token(t, first) {
		t.Fatalf("second's token %d is not above first's %d", token(t, second), token(t, first))
	}

	ended = remove(t, second)
	t.Logf("permit freed %s after the second pod was deleted", freedWithin(t, second, ended, 2*time.Second))
	third = admitted(t, ns, "third")
	permitOf(t, third)
	if token(t, third) <= token(t, second) {
		t.Fatalf("third's token %d is not above second's %d", token(t, third), token(t, second))
	}
}

func TestASemaphoreOfTwoLetsInAtMostTwo(t *testing.T) {
	ns := entitledNamespace(t)
	var pods []*corev1.Pod
	for i := range 5 {
		pods = append(pods, gated(t, ns, fmt.Sprintf("p%d", i), "licence", gatedpod.LimitAnnotation, "2"))
	}
	a, b := admitted(t, ns, "p0"), admitted(t, ns, "p1")
	told(t, pods[2], "Waiting", "number 1 in line")
	told(t, pods[4], "Waiting", "number 3 in line")
	if got := running(t, ns); len(got) != 2 {
		t.Fatalf("let in %v, want p0 and p1", got)
	}
	if permitOf(t, a).Spec.Slot == permitOf(t, b).Spec.Slot {
		t.Fatal("two pods share a slot")
	}
	finish(t, a)
	admitted(t, ns, "p2")
	told(t, pods[3], "Waiting", "number 1 in line")
	if got := running(t, ns); !slices.Equal(got, []string{"p1", "p2"}) {
		t.Fatalf("let in %v, want p1 and p2", got)
	}
}

func TestAPodDeletedWhileWaitingLeavesTheLine(t *testing.T) {
	ns := entitledNamespace(t)
	gated(t, ns, "holder", "report")
	leaves := gated(t, ns, "leaves", "report")
	stays := gated(t, ns, "stays", "report")
	holder := admitted(t, ns, "holder")
	told(t, stays, "Waiting", "number 2 in line")
	remove(t, leaves)
	told(t, stays, "Waiting", "number 1 in line")
	finish(t, holder)
	admitted(t, ns, "stays")
	if len(heldBy(t, ns, "report", "pod:"+string(leaves.UID))) != 0 {
		t.Fatal("the pod that left the line holds a permit")
	}
}

func TestAPodPastItsTTLIsDeletedAndItsDeadlineLowered(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	gated(t, ns, "bounded", "bounded", gatedpod.TTLAnnotation, "3s")
	p := admitted(t, ns, "bounded")
	q := permitOf(t, p)
	// The permit lives the ttl plus the pod's termination grace period.
	if q.Spec.TTLSeconds != 3+30 {
		t.Fatalf("permit ttl %d, want 33 (3s ttl + 30s grace)", q.Spec.TTLSeconds)
	}
	// Once the pod has started, the kubelet is told to stop it at the ttl.
	p.Status.StartTime = &metav1.Time{Time: time.Now()}
	if err := env.Client.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		cur, ok := get(t, ns, "bounded")
		return !ok || (cur.Spec.ActiveDeadlineSeconds != nil && *cur.Spec.ActiveDeadlineSeconds <= 3), nil
	})
	if err != nil {
		t.Fatal("activeDeadlineSeconds was not lowered to the ttl")
	}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		cur, ok := get(t, ns, "bounded")
		return !ok || cur.UID != p.UID, nil
	})
	if err != nil {
		t.Fatal("the pod was not deleted at its ttl")
	}
	freedWithin(t, p, time.Now(), 10*time.Second)
}

func TestRouteHoldersAndGatedPodsShareOneLimit(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	l := locks.New(env.Client, nil)
	held, err := l.Acquire(ctx, ns, "shared", "route-caller", 600, 2)
	if err != nil || !held.Acquired {
		t.Fatal(held, err)
	}
	a := gated(t, ns, "a", "shared", gatedpod.LimitAnnotation, "2")
	b := gated(t, ns, "b", "shared", gatedpod.LimitAnnotation, "2")
	admitted(t, ns, "a")
	told(t, b, "Waiting", "number 1 in line")
	if got := running(t, ns); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("let in %v with a route caller holding one of two slots", got)
	}
	// The route caller's release frees a slot: the line is woken by it.
	if ok, err := l.Release(ctx, ns, "shared", held.Slot, held.Token, "route-caller"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	admitted(t, ns, "b")
	// And a gated pod's slot is one a route caller cannot take.
	again, err := l.Acquire(ctx, ns, "shared", "route-caller", 600, 2)
	if err != nil || again.Acquired || again.Reason != locks.ReasonHeld {
		t.Fatalf("a route caller got %+v with both slots held by pods", again)
	}
	finish(t, a)
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		got, err := l.Acquire(ctx, ns, "shared", "route-caller", 600, 2)
		return got.Acquired, err
	})
	if err != nil {
		t.Fatal("the route caller did not get the slot the finished pod left")
	}
	if n := len(heldBy(t, ns, "shared", "")); n > 2 {
		t.Fatalf("%d permits of a semaphore of 2", n)
	}
}

// A holder that stops renewing is taken over once its permit has expired,
// as a waiting route caller would take it over: the line does not wait for
// the expiry controller's delete, which here never comes.
func TestAnExpiredHolderIsTakenOverWithoutADelete(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	env.BlockPermitDeletes(t, ns)
	stuck, err := locks.New(env.Client, nil).Acquire(ctx, ns, "stuck", "gone-away", 2, 1)
	if err != nil || !stuck.Acquired {
		t.Fatal(stuck, err)
	}
	p := gated(t, ns, "next", "stuck")
	told(t, p, "Waiting", `held by "gone-away"`)
	got := admitted(t, ns, "next")
	tok, err := strconv.ParseUint(got.Annotations[gatedpod.TokenAnnotation], 10, 64)
	if err != nil || tok <= stuck.Token {
		t.Fatalf("the pod took over with token %q, want above the expired holder's %d", got.Annotations[gatedpod.TokenAnnotation], stuck.Token)
	}
	if q := permitOf(t, got); q.Spec.Owner != gatedpod.Owner(got) {
		t.Fatalf("the permit's owner is %q, want the pod", q.Spec.Owner)
	}
}

// The line passes over the freed slots of locks without gated pods (most
// locks, the route's and the handles'): their releases wake no reconcile of
// the line, while a release of a lock a gated pod waits for still lets it
// in.
func TestReleasesOfLocksWithoutGatedPodsWakeNoLine(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	reconciles := func() float64 {
		var n float64
		for _, r := range []string{"success", "error", "requeue", "requeue_after"} {
			if m := metricstest.Series(t, "controller_runtime_reconcile_total", map[string]string{"controller": "gate", "result": r}); m != nil {
				n += m.GetCounter().GetValue()
			}
		}
		return n
	}
	l := locks.New(env.Client, nil)
	busy, err := l.Acquire(ctx, ns, "busy", "route-caller", 600, 1)
	if err != nil || !busy.Acquired {
		t.Fatal(busy, err)
	}
	p := gated(t, ns, "next", "busy")
	told(t, p, "Waiting", "number 1 in line")

	before := reconciles()
	const cycles = 30
	for i := range cycles {
		// A lock of its own each time: releases of one lock in a row
		// could share one queued reconcile.
		lock := fmt.Sprintf("plain-%d", i)
		a, err := l.Acquire(ctx, ns, lock, "route-caller", 600, 1)
		if err != nil || !a.Acquired {
			t.Fatal(a, err)
		}
		if ok, err := l.Release(ctx, ns, lock, a.Slot, a.Token, "route-caller"); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	// The gated pod's lock is released after all of them: its delete
	// comes after theirs, and wakes the line.
	if ok, err := l.Release(ctx, ns, "busy", busy.Slot, busy.Token, "route-caller"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	admitted(t, ns, "next")
	// Letting the pod in takes a few reconciles of its own (the release,
	// the pod's patch, its waiter leaving); other tests' lines looking
	// again may add a few more.
	if got := reconciles() - before; got >= cycles/2 {
		t.Errorf("%v reconciles of the line over %d releases of locks without gated pods and one with, want a few", got, cycles)
	}
}
