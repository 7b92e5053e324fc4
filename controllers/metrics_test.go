package controllers_test

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/controllers"
	"github.com/queen-locks/queen-locks/internal/metricstest"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// sample is one series of a metric of the manager's registry: a counter's
// or gauge's value, or a histogram's count and sum.
type sample struct {
	value, count, sum float64
	found             bool
}

// metric reads the series of name whose labels are exactly labels.
func metric(t *testing.T, name string, labels map[string]string) sample {
	t.Helper()
	m := metricstest.Series(t, name, labels)
	switch {
	case m.GetHistogram() != nil:
		return sample{count: float64(m.GetHistogram().GetSampleCount()), sum: m.GetHistogram().GetSampleSum(), found: true}
	case m.GetCounter() != nil:
		return sample{value: m.GetCounter().GetValue(), found: true}
	case m.GetGauge() != nil:
		return sample{value: m.GetGauge().GetValue(), found: true}
	}
	return sample{}
}

func holds(t *testing.T, ns, end string) sample {
	t.Helper()
	return metric(t, "queen_locks_hold_seconds", map[string]string{"namespace": ns, "end": end})
}

// await polls cond until it holds, or fails the test after a minute.
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, time.Minute, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// holdEndsWatched waits until the controller's hold timer sees permits
// end: the manager's cache syncs before the controller registers its
// handlers, and a permit ended in between is never timed. It releases a
// permit of its own until one is timed.
func holdEndsWatched(t *testing.T) {
	t.Helper()
	watchedOnce.Do(func() {
		ctx := context.Background()
		ns := namespace(t)
		l := locks.New(env.Client, nil)
		await(t, "the hold timer to see a release", func() bool {
			a, err := l.Acquire(ctx, ns, "warm-up", "w", 600, 1)
			if err != nil || !a.Acquired {
				t.Fatal(a, err)
			}
			if _, err := l.Release(ctx, ns, "warm-up", 0, a.Token, "w"); err != nil {
				t.Fatal(err)
			}
			return wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Second, true, func(context.Context) (bool, error) {
				return holds(t, ns, controllers.EndReleased).found, nil
			}) == nil
		})
	})
}

var watchedOnce sync.Once

func near(got, want float64) bool { return math.Abs(got-want) < 1e-3 }

// Each way a holding ends is told apart: a release by its holder, an
// expiry and a pod gone (the controller's own deletes), each timed from
// acquireTime.
func TestHoldTimesByHowTheyEnded(t *testing.T) {
	holdEndsWatched(t)
	ctx := context.Background()
	ns := namespace(t)
	l := locks.New(env.Client, nil)

	start := time.Now()
	a, err := l.Acquire(ctx, ns, "released", "a", 600, 1)
	if err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	if ok, err := l.Release(ctx, ns, "released", 0, a.Token, "a"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	await(t, "the release to be timed", func() bool { return holds(t, ns, controllers.EndReleased).count == 1 })
	if got := holds(t, ns, controllers.EndReleased).sum; got <= 0 || got > time.Since(start).Seconds() {
		t.Errorf("released after %v s, but %v s passed from before the acquire", got, time.Since(start).Seconds())
	}

	// An expired permit held exactly its TTL: the holding ended at its
	// expireTime, not when the controller deleted it.
	create(t, ns, "expired", 1)
	await(t, "the expiry to be timed", func() bool { return holds(t, ns, controllers.EndExpired).count == 1 })
	if got := holds(t, ns, controllers.EndExpired).sum; !near(got, 1) {
		t.Errorf("an expired permit of TTL 1 s held %v s", got)
	}

	p := pod(t, ns, "holder")
	start = time.Now()
	holdAs(t, ns, "pod-gone", p)
	if err := env.Client.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return holds(t, ns, controllers.EndPodGone).count == 1, nil
	}); err != nil {
		var left locksv1alpha1.QueenLockList
		_ = env.Client.List(ctx, &left, client.InNamespace(ns))
		t.Fatalf("the pod-gone release was not timed: released %+v, expired %+v, pod-gone %+v; permits left %d",
			holds(t, ns, controllers.EndReleased), holds(t, ns, controllers.EndExpired), holds(t, ns, controllers.EndPodGone), len(left.Items))
	}
	if got := holds(t, ns, controllers.EndPodGone).sum; got <= 0 || got > time.Since(start).Seconds() {
		t.Errorf("held by a gone pod for %v s, but %v s passed from before the acquire", got, time.Since(start).Seconds())
	}
	// The controller's own deletes were not taken for releases.
	if got := holds(t, ns, controllers.EndReleased).count; got != 1 {
		t.Errorf("%v releases timed, want the one release", got)
	}
	if got := holds(t, ns, controllers.EndTakenOver); got.found {
		t.Errorf("a takeover timed where none happened: %+v", got)
	}
}

// A takeover (an expired permit acquired again before the controller
// deleted it) ends the old holding at its expireTime; nothing is counted
// as expired.
func TestATakeoverEndsAHolding(t *testing.T) {
	holdEndsWatched(t)
	ctx := context.Background()
	ns := namespace(t)
	env.BlockPermitDeletes(t, ns)
	a, err := locks.New(env.Client, nil).Acquire(ctx, ns, "handover", "first", 1, 1)
	if err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	var b locks.Acquired
	await(t, "the takeover", func() bool {
		b, err = locks.New(env.Client, nil, locks.WithGrace(env.Grace)).Acquire(ctx, ns, "handover", "second", 600, 1)
		if err != nil {
			t.Fatal(err)
		}
		return b.Acquired
	})
	await(t, "the takeover to be timed", func() bool { return holds(t, ns, controllers.EndTakenOver).count == 1 })
	if got := holds(t, ns, controllers.EndTakenOver).sum; !near(got, 1) {
		t.Errorf("the first holder, TTL 1 s, held %v s", got)
	}
	// The renew of the new holding ends nothing.
	if r, err := locks.New(env.Client, nil).Renew(ctx, ns, "handover", 0, b.Token, "second", 600); err != nil || !r.Renewed {
		t.Fatal(r, err)
	}
	for _, end := range []string{controllers.EndExpired, controllers.EndReleased, controllers.EndPodGone} {
		if got := holds(t, ns, end); got.found {
			t.Errorf("%s timed: %+v", end, got)
		}
	}
	if got := holds(t, ns, controllers.EndTakenOver).count; got != 1 {
		t.Errorf("%v takeovers timed, want 1", got)
	}
}

// A permit past its expireTime and the grace that is still there (its
// delete refused) is overdue, and no longer held.
func TestOverduePermitsAreCounted(t *testing.T) {
	ns := namespace(t)
	env.BlockPermitDeletes(t, ns) // holds the probe, 3600 s
	overdue := func() sample {
		return metric(t, "queen_locks_permits_overdue", map[string]string{"namespace": ns})
	}
	held := func() float64 { return metric(t, "queen_locks_permits_held", map[string]string{"namespace": ns}).value }
	await(t, "the namespace's series", func() bool { s := overdue(); return s.found && s.value == 0 && held() == 1 })
	p := create(t, ns, "late", 1)
	await(t, "the new permit to be held", func() bool { return held() == 2 })
	await(t, "the permit to be overdue", func() bool { return overdue().value == 1 })
	var got locksv1alpha1.QueenLock
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(p), &got); err != nil {
		t.Fatal(err)
	}
	// Not before its expireTime plus the controller's grace.
	if late := time.Since(got.Spec.ExpireTime.Time); late < env.Grace {
		t.Errorf("overdue %v after its expireTime, before the grace %v", late, env.Grace)
	}
	if h := held(); h != 1 {
		t.Errorf("%v permits held, want the probe alone", h)
	}
}

// The pods permits name are counted from the objects, and the leader
// follows as many.
func TestHolderPodsNamedAreFollowed(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	named := func() float64 { return metric(t, "queen_locks_holder_pods_named", map[string]string{}).value }
	followed := func() float64 { return metric(t, "queen_locks_holder_pods_followed", map[string]string{}).value }
	watched := func() float64 {
		return metric(t, "queen_locks_holder_pod_namespaces_watched", map[string]string{}).value
	}
	await(t, "the leader to follow every named pod", func() bool { return followed() == named() })
	before, spaces := named(), watched()
	p := pod(t, ns, "named")
	holdAs(t, ns, "first", p)
	holdAs(t, ns, "second", p) // the same pod, counted once
	await(t, "the pod to be named and followed, its namespace watched", func() bool {
		return named() == before+1 && followed() == before+1 && watched() == spaces+1
	})
	if err := env.Client.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	await(t, "the gone pod to be forgotten, its namespace's watch stopped", func() bool {
		return named() == before && followed() == before && watched() == spaces
	})
}

// A holder pod that cannot be listed (here: a tracker whose identity may
// not read pods) is counted as an error, again at each try.
func TestHolderPodErrorsAreCounted(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "blind"}}
	if err := env.Client.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	// It may not even list pods: every list is refused.
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: fmt.Sprintf("system:serviceaccount:%s:%s", ns, sa.Name)}
	tracker := trackerAs(t, cfg)

	failures := func() float64 { return metric(t, "queen_locks_holder_pod_errors_total", map[string]string{}).value }
	before := failures()
	p := pod(t, ns, "unseen")
	held := &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: permit.Name("unseen", 0)},
		Spec: locksv1alpha1.QueenLockSpec{Lock: "unseen", HolderPod: &locksv1alpha1.PodRef{Namespace: ns, Name: p.Name, UID: string(p.UID)}}}
	if st := tracker.Track(ctx, held); st.Known {
		t.Fatalf("a pod nobody could list is known: %+v", st)
	}
	await(t, "two failed lists", func() bool { return failures() >= before+2 })
	if st := tracker.Track(ctx, held); st.Known || st.Gone {
		t.Fatalf("a pod nobody could list: %+v, want unknown, not gone", st)
	}
}
