package locks_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/locks/waiters"
	"github.com/queen-locks/queen-locks/permit"
)

// asManager is a lock Client as the manager's route runs it: stamped
// writes, the fence, and a line hint. The hint here reads the API server
// (a cache that is never behind), so that a release always knows of a
// waiter that joined before it.
func asManager(t *testing.T) *locks.Client {
	t.Helper()
	fence, err := manager.NewFence(env.Config, nil)
	if err != nil {
		t.Fatal(err)
	}
	return locks.New(env.Client, nil, locks.WithGrace(env.Grace), locks.AsManager(), locks.WithFence(fence),
		locks.WithVersions(locks.CachedVersions(env.Client)))
}

type answer struct {
	got locks.Acquired
	err error
}

// waitInLine starts a direct client's acquire that waits in the line of
// lock (over the Kubernetes API, with its own watch), and answers once its
// waiter is in the line.
func waitInLine(t *testing.T, ns, lock, owner string, ttl int64, limit int) <-chan answer {
	t.Helper()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: manager.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan answer, 1)
	go func() {
		got, err := locks.New(env.Client, nil).Acquire(context.Background(), ns, lock, owner, ttl, limit,
			locks.WaitUpTo(30*time.Second, waiters.Watcher{C: wc, Grace: env.Grace}))
		out <- answer{got, err}
	}()
	awaitWaiter(t, ns, lock, owner)
	return out
}

// awaitWaiter waits until owner's waiter is in the line of lock.
func awaitWaiter(t *testing.T, ns, lock, owner string) *locksv1alpha1.QueenLockWaiter {
	t.Helper()
	var found *locksv1alpha1.QueenLockWaiter
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		ws, err := locks.New(env.Client, nil).Line(ctx, ns, lock)
		for i := range ws {
			if ws[i].Spec.Owner == owner {
				found = &ws[i]
				return true, nil
			}
		}
		return false, err
	})
	if err != nil {
		t.Fatalf("waiter %q never joined the line of %q: %v", owner, lock, err)
	}
	return found
}

func permitOf(t *testing.T, ns, lock string, slot int) *locksv1alpha1.QueenLock {
	t.Helper()
	p := &locksv1alpha1.QueenLock{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: permit.Name(lock, slot)}, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func receive(t *testing.T, c <-chan answer) locks.Acquired {
	t.Helper()
	select {
	case a := <-c:
		if a.err != nil {
			t.Fatal(a.err)
		}
		return a.got
	case <-time.After(40 * time.Second):
		t.Fatal("the waiting acquire never answered")
	}
	return locks.Acquired{}
}

// A release of a lock whose line waits rewrites the permit for the head of
// the line: when the release has answered, the slot is already the
// waiter's, so a plain acquire sent right then answers held (it never gets
// the slot), and the waiter answers acquired (not already), with a token
// above the released holding's, renewed to the lifetime it asked for. The
// waiter leaves the line.
//
// It holds for the manager's release (over the route) and for a direct
// client's (a handle's or the CLI's over the Kubernetes API), which learns
// of the waiter from kube-apiserver's watch cache and whose handover the
// permit webhook judges against the line.
func TestAReleaseHandsTheSlotToTheHeadOfTheLine(t *testing.T) {
	t.Run("manager", func(t *testing.T) { releaseHandsOver(t, asManager(t)) })
	t.Run("direct", func(t *testing.T) { releaseHandsOver(t, locks.New(env.Client, nil)) })
}

func releaseHandsOver(t *testing.T, m *locks.Client) {
	ctx := context.Background()
	ns := env.Namespace(t, "handover")
	a, err := m.Acquire(ctx, ns, "report", "a", 600, 1)
	if err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	b := waitInLine(t, ns, "report", "b", 120, 1)
	if ok, err := m.Release(ctx, ns, "report", 0, a.Token, "a"); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	c, err := locks.New(env.Client, nil).Acquire(ctx, ns, "report", "c", 60, 1)
	if err != nil || c.Acquired || c.Reason != locks.ReasonHeld || len(c.Holders) != 1 || c.Holders[0].Owner != "b" {
		t.Fatalf("a plain acquire right after the release: %+v %v, want held by b", c, err)
	}
	got := receive(t, b)
	if !got.Acquired || got.Already || got.Token <= a.Token || got.Floor <= a.Token || got.Floor > got.Token {
		t.Fatalf("the waiter's answer %+v, want acquired with a token above %d", got, a.Token)
	}
	if left := time.Until(got.ExpiresAt); left < 100*time.Second {
		t.Fatalf("the waiter's permit expires in %s: not renewed to the 120 s it asked", left)
	}
	p := permitOf(t, ns, "report", 0)
	if p.Spec.Owner != "b" || p.Spec.Waiter == "" || p.Spec.FirstToken != int64(got.Floor) || p.Spec.TTLSeconds != 120 {
		t.Fatalf("permit %+v, want b's holding that began at the handover (%d)", p.Spec, got.Floor)
	}
	if ws, err := locks.New(env.Client, nil).Line(ctx, ns, "report"); err != nil || len(ws) != 0 {
		t.Fatalf("line %v %v, want empty: the served waiter leaves", ws, err)
	}
}

// A release that nobody waits for is still one delete; a free lock's
// acquire is still one create.
func TestAReleaseWithNoLineIsOneDelete(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t, "handover-cost")
	fence, err := manager.NewFence(env.Config, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := locks.New(env.Client, nil, locks.WithGrace(env.Grace), locks.AsManager(), locks.WithFence(fence),
		locks.WithVersions(locks.CachedVersions(env.Manager.GetCache())))
	keys := []string{"POST queenlocks", "PUT queenlocks", "PATCH queenlocks", "DELETE queenlocks", "GET queenlocks", "LIST queenlocks", "LIST queenlockwaiters"}
	before := apiRequests(t)
	a, err := m.Acquire(ctx, ns, "free", "a", 600, 1)
	if err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	if got := diff(before, apiRequests(t), keys...); len(got) != 1 || got["POST queenlocks"] != 1 {
		t.Fatalf("acquire of a free lock: %v, want one create", got)
	}
	// The manager's cache has seen the create once its release finds the
	// version there: then the release reads nothing.
	awaitCached(t, ns, "free", a.Token)
	before = apiRequests(t)
	if ok, err := m.Release(ctx, ns, "free", 0, a.Token, "a"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if got := diff(before, apiRequests(t), keys...); len(got) != 1 || got["DELETE queenlocks"] != 1 {
		t.Fatalf("release with nobody waiting: %v, want one delete", got)
	}
}

func awaitCached(t *testing.T, ns, lock string, tok uint64) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		p := &locksv1alpha1.QueenLock{}
		err := env.Manager.GetCache().Get(ctx, client.ObjectKey{Namespace: ns, Name: permit.Name(lock, 0)}, p)
		return err == nil && p.ResourceVersion == strconv.FormatUint(tok, 10), nil
	})
	if err != nil {
		t.Fatal("the manager's cache never showed the permit")
	}
}

// A semaphore of 3 hands each freed slot to the next waiter in line, in
// order, and a plain acquire sent after each release finds every slot held.
func TestASemaphoreHandsEachFreedSlotInOrder(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t, "handover-sem")
	m := asManager(t)
	held := map[string]locks.Acquired{}
	for _, o := range []string{"h1", "h2", "h3"} {
		got, err := m.Acquire(ctx, ns, "pool", o, 600, 3)
		if err != nil || !got.Acquired {
			t.Fatal(got, err)
		}
		held[o] = got
	}
	w1 := waitInLine(t, ns, "pool", "w1", 120, 3)
	w2 := waitInLine(t, ns, "pool", "w2", 120, 3)
	var last uint64
	for _, c := range []struct {
		release string
		waiter  <-chan answer
		owner   string
	}{{"h2", w1, "w1"}, {"h3", w2, "w2"}} {
		h := held[c.release]
		if ok, err := m.Release(ctx, ns, "pool", h.Slot, h.Token, c.release); err != nil || !ok {
			t.Fatal(ok, err)
		}
		p, err := locks.New(env.Client, nil).Acquire(ctx, ns, "pool", "plain", 60, 3)
		if err != nil || p.Acquired {
			t.Fatalf("a plain acquire after %s's release: %+v %v, want held", c.release, p, err)
		}
		got := receive(t, c.waiter)
		if !got.Acquired || got.Already || got.Slot != h.Slot || got.Floor <= last {
			t.Fatalf("%s: %+v, want slot %d, handed after the earlier handover (%d)", c.owner, got, h.Slot, last)
		}
		last = got.Floor
	}
}

// An expiry with a line hands the slot over too, to the head of the line,
// with the waiter's own ttlSeconds (6 s), not the 600 s it asked: here the
// head's carrier is dead (a waiter object nobody renews or claims), so
// the permit is handed to it, expires after those 6 s, and is handed on
// to the next waiter, which acquires it. Nothing leaks: the dead waiter's
// slot is held no longer than its own ttl.
func TestAnExpiryHandsOverAndADeadWaitersPermitGoesOn(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t, "handover-expiry")
	m := asManager(t)
	a, err := m.Acquire(ctx, ns, "nightly", "a", 3, 1)
	if err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	dead := &locksv1alpha1.QueenLockWaiter{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "nightly-", Labels: map[string]string{permit.LockLabel: permit.LabelValue("nightly")}},
		Spec:       locksv1alpha1.QueenLockWaiterSpec{Lock: "nightly", Owner: "dead", Limit: 1, TTLSeconds: 6, HoldSeconds: 600, Carrier: "test"},
	}
	if err := env.Client.Create(ctx, dead); err != nil {
		t.Fatal(err)
	}
	live := waitInLine(t, ns, "nightly", "live", 60, 1)
	var handed *locksv1alpha1.QueenLock
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		p := &locksv1alpha1.QueenLock{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: permit.Name("nightly", 0)}, p); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if p.Spec.Owner == "dead" {
			handed = p
			return true, nil
		}
		return p.Spec.Owner != "a", nil
	})
	if err != nil || handed == nil {
		t.Fatalf("the expired permit was not handed to the head of the line: %v", err)
	}
	if handed.Spec.Waiter != dead.Name || handed.Spec.TTLSeconds != 6 {
		t.Fatalf("handed %+v, want waiter %s with its own 6 s", handed.Spec, dead.Name)
	}
	if tok, _ := permit.Token(handed.ResourceVersion); tok <= a.Token {
		t.Fatalf("handover token %d, not above the expired holding's %d", tok, a.Token)
	}
	got := receive(t, live)
	if !got.Acquired || got.Already {
		t.Fatalf("the live waiter behind the dead one: %+v", got)
	}
	if left := got.ExpiresAt.Sub(handed.Spec.ExpireTime.Time); left < 0 {
		t.Fatalf("the live waiter's permit came before the dead waiter's ended")
	}
}

// Two replicas that free two slots of a semaphore at once can each hand
// one to the same head (each read the permits before the other's
// handover landed). Written here as the manager writes them (this suite's
// manager writes as the admin, whose handovers the webhook does not
// judge): the owner's acquire keeps the earliest and gives the other back
// at once, so no slot idles for the lifetime it was handed with.
func TestAnOwnerHandedTwoSlotsKeepsOneAndGivesTheOtherBack(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t, "handover-twice")
	m := asManager(t)
	for _, o := range []string{"h0", "h1", "h2"} {
		if got, err := m.Acquire(ctx, ns, "pool", o, 600, 3); err != nil || !got.Acquired {
			t.Fatal(got, err)
		}
	}
	w := &locksv1alpha1.QueenLockWaiter{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "pool-", Labels: map[string]string{permit.LockLabel: permit.LabelValue("pool")}},
		Spec:       locksv1alpha1.QueenLockWaiterSpec{Lock: "pool", Owner: "w", Limit: 3, TTLSeconds: 6, HoldSeconds: 600, Carrier: "test"},
	}
	if err := env.Client.Create(ctx, w); err != nil {
		t.Fatal(err)
	}
	for _, slot := range []int{1, 2} {
		if err := env.Client.Update(ctx, permit.Handed(permitOf(t, ns, "pool", slot), w)); err != nil {
			t.Fatalf("handing slot %d: %v", slot, err)
		}
	}
	got, err := locks.New(env.Client, nil).Acquire(ctx, ns, "pool", "w", 600, 3)
	if err != nil || !got.Acquired || got.Slot != 1 {
		t.Fatalf("the acquire of the owner handed slots 1 and 2: %+v %v, want slot 1, the earlier", got, err)
	}
	p := &locksv1alpha1.QueenLock{}
	err = env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: permit.Name("pool", 2)}, p)
	if err == nil {
		t.Fatalf("slot 2 is still %s's (waiter %q) after its owner was answered slot 1: not given back", p.Spec.Owner, p.Spec.Waiter)
	}
	if client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
}
