package locks_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// preferred is the slot a semaphore acquire of owner tries first when it
// is free: the same hash as the package's, so that a test can make the
// owner hold another slot.
func preferred(owner string, limit int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(owner))
	return int(h.Sum32() % uint32(limit))
}

// slotsOf lists the slots owner holds of lock, as stored.
func slotsOf(t *testing.T, ns, lock, owner string) []int {
	t.Helper()
	var list locksv1alpha1.QueenLockList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns), client.MatchingLabels{permit.LockLabel: permit.LabelValue(lock)}); err != nil {
		t.Fatal(err)
	}
	var slots []int
	for _, p := range list.Items {
		if p.Spec.Owner == owner && p.DeletionTimestamp.IsZero() {
			slots = append(slots, int(p.Spec.Slot))
		}
	}
	slices.Sort(slots)
	return slots
}

// An owner that holds a slot other than its preferred one, while the
// preferred one is free, asks again: it is answered its slot, and nothing
// is written (no create of the preferred slot given back afterwards).
func TestASemaphoreOwnersRepeatWritesNothing(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	const lock, limit = "repeat-sem", 4
	l := locks.New(env.Client, nil)
	want := preferred("a", limit)
	other := ""
	for i := 0; other == ""; i++ {
		if o := fmt.Sprintf("o%d", i); preferred(o, limit) == want {
			other = o
		}
	}
	o, err := l.Acquire(ctx, ns, lock, other, 30, limit)
	if err != nil || !o.Acquired || o.Slot != want {
		t.Fatalf("acquire of slot %d by %s: %+v %v", want, other, o, err)
	}
	a, err := l.Acquire(ctx, ns, lock, "a", 30, limit)
	if err != nil || !a.Acquired || a.Slot == want {
		t.Fatalf("acquire by a with its preferred slot %d taken: %+v %v", want, a, err)
	}
	if ok, err := l.Release(ctx, ns, lock, o.Slot, o.Token, other); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}

	c := &counting{Client: env.Client}
	again, err := locks.New(c, nil).Acquire(ctx, ns, lock, "a", 30, limit)
	if err != nil || !again.Acquired || !again.Already || again.Slot != a.Slot || again.Token != a.Token {
		t.Fatalf("repeat acquire: %+v %v, want already slot %d token %d", again, err, a.Slot, a.Token)
	}
	if n := c.takeStored(); n != 0 {
		t.Fatalf("the repeat acquire stored %d writes (calls %v), want none", n, c.take())
	}
	if got := slotsOf(t, ns, lock, "a"); !slices.Equal(got, []int{a.Slot}) {
		t.Fatalf("a holds slots %v, want [%d]", got, a.Slot)
	}
}

// An owner holds slot 1, taken with limit 2; then it asks with limit 1.
// It is answered slot 1 as already held, whether slot 0 is held by
// another owner (nothing is written) or free (it never ends up holding
// two slots), and a stranger's limit-1 acquire still takes slot 0.
func TestALimitOneAcquireFindsItsOwnersHigherSlot(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	const lock = "dropped-limit"
	l := locks.New(env.Client, nil)
	b, err := l.Acquire(ctx, ns, lock, "b", 30, 1)
	if err != nil || !b.Acquired || b.Slot != 0 {
		t.Fatalf("acquire by b: %+v %v", b, err)
	}
	a, err := l.Acquire(ctx, ns, lock, "a", 30, 2)
	if err != nil || !a.Acquired || a.Slot != 1 {
		t.Fatalf("acquire by a with limit 2: %+v %v", a, err)
	}

	c := &counting{Client: env.Client}
	got, err := locks.New(c, nil).Acquire(ctx, ns, lock, "a", 30, 1)
	if err != nil || !got.Already || got.Slot != 1 || got.Token != a.Token {
		t.Fatalf("limit-1 acquire by a while b holds slot 0: %+v %v, want already slot 1 token %d", got, err, a.Token)
	}
	if n := c.takeStored(); n != 0 {
		t.Fatalf("the repeat acquire stored %d writes (calls %v), want none", n, c.take())
	}

	if ok, err := l.Release(ctx, ns, lock, 0, b.Token, "b"); err != nil || !ok {
		t.Fatalf("release by b: %v %v", ok, err)
	}
	got, err = l.Acquire(ctx, ns, lock, "a", 30, 1)
	if err != nil || !got.Already || got.Slot != 1 || got.Token != a.Token {
		t.Fatalf("limit-1 acquire by a with slot 0 free: %+v %v, want already slot 1 token %d", got, err, a.Token)
	}
	if slots := slotsOf(t, ns, lock, "a"); !slices.Equal(slots, []int{1}) {
		t.Fatalf("a holds slots %v, want [1]", slots)
	}
	// The larger limit rules: a caller with limit 1 shares slot 0.
	s, err := l.Acquire(ctx, ns, lock, "s", 30, 1)
	if err != nil || !s.Acquired || s.Already || s.Slot != 0 {
		t.Fatalf("limit-1 acquire by a stranger while a holds slot 1: %+v %v, want slot 0", s, err)
	}
}

// One owner acquires with limit 1 and with limit 3 at once, as a caller
// changing its limit while a retry is in flight would: it ends up with one
// slot, and every answer names it.
func TestOneOwnerRacingItselfAcrossLimitsGetsOneSlot(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	const rounds, racers = 10, 6
	for round := range rounds {
		lock := fmt.Sprintf("limits-race-%d", round)
		if round%2 == 1 {
			// Slot 0 held by another owner: the limit-1 racers can only
			// be answered the slot a limit-3 racer won.
			if a, err := locks.New(env.Client, nil).Acquire(ctx, ns, lock, "other", 30, 1); err != nil || !a.Acquired {
				t.Fatal(a, err)
			}
		}
		answers := make([]locks.Acquired, racers)
		errs := make([]error, racers)
		var wg sync.WaitGroup
		for i := range racers {
			l := locks.New(env.Client, nil)
			limit := 1 + 2*(i%2)
			wg.Go(func() { answers[i], errs[i] = l.Acquire(ctx, ns, lock, "me", 30, limit) })
		}
		wg.Wait()
		mine := slotsOf(t, ns, lock, "me")
		if len(mine) != 1 {
			t.Fatalf("round %d: owner holds slots %v", round, mine)
		}
		for i, a := range answers {
			if errs[i] != nil {
				t.Fatalf("round %d: %v", round, errs[i])
			}
			if a.Acquired && a.Slot != mine[0] {
				t.Fatalf("round %d: answer %+v, but the owner holds slot %d", round, a, mine[0])
			}
		}
	}
}
