package controllers_test

import (
	"context"
	"testing"

	"github.com/queen-locks/queen-locks/locks"
)

// A permit's delete is queued for the expiry controller only when the
// permit named a holder pod: its reconcile then stops following that pod,
// and the pod's namespace is no longer watched. A released permit without
// one leaves the controller nothing to do, and its delete is not queued.
func TestOnlyDeletesOfPodHeldPermitsAreReconciled(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	results := func(r string) float64 {
		return metric(t, "controller_runtime_reconcile_total", map[string]string{"controller": "queenlock-expiry", "result": r}).value
	}
	followed := func() float64 { return metric(t, "queen_locks_holder_pods_followed", map[string]string{}).value }
	watched := func() float64 {
		return metric(t, "queen_locks_holder_pod_namespaces_watched", map[string]string{}).value
	}
	named := func() float64 { return metric(t, "queen_locks_holder_pods_named", map[string]string{}).value }
	await(t, "the leader to follow every named pod", func() bool { return followed() == named() })

	l := locks.New(env.Client, nil)
	done := results("success")
	const cycles = 20
	for range cycles {
		scheduled := results("requeue_after")
		a, err := l.Acquire(ctx, ns, "plain", "a", 600, 1)
		if err != nil || !a.Acquired {
			t.Fatal(a, err)
		}
		// The create is reconciled (its expiry scheduled) before the
		// delete: a create the queue still held when the delete came
		// would be reconciled once, for both.
		await(t, "the new permit's expiry to be scheduled", func() bool { return results("requeue_after") > scheduled })
		if _, err := l.Release(ctx, ns, "plain", 0, a.Token, "a"); err != nil {
			t.Fatal(err)
		}
	}

	// A pod-held permit released by its holder while the pod lives: the
	// delete that comes after every one above is reconciled, and the pod
	// is followed no more.
	before, spaces := followed(), watched()
	p := pod(t, ns, "holder")
	a := holdAs(t, ns, "pod-held", p)
	await(t, "the holder's pod to be followed, its namespace watched", func() bool {
		return followed() == before+1 && watched() == spaces+1
	})
	if _, err := l.Release(ctx, ns, "pod-held", 0, a.Token, "owner-"+p.Name); err != nil {
		t.Fatal(err)
	}
	await(t, "the released permit's pod to be followed no more, its namespace's watch stopped", func() bool {
		return followed() == before && watched() == spaces
	})
	// Each delete that was reconciled ended in success; other tests'
	// permits falling due may add a few.
	if got := results("success") - done; got >= cycles/2 {
		t.Errorf("%v reconciles ended in success over %d releases of permits without a holder pod and one with, want about 1", got, cycles)
	}
}
