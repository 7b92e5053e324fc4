package locks

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

// fixedFollow is a watch that shows fixed permits and waiters.
type fixedFollow struct {
	permits []locksv1alpha1.QueenLock
	line    []locksv1alpha1.QueenLockWaiter
}

func (f fixedFollow) C() <-chan struct{}                 { return nil }
func (f fixedFollow) Permits() []locksv1alpha1.QueenLock { return f.permits }
func (f fixedFollow) Line() ([]locksv1alpha1.QueenLockWaiter, bool) {
	return f.line, true
}
func (f fixedFollow) Stop() {}

func waiterAt(name, owner string, key int64, limit int32) locksv1alpha1.QueenLockWaiter {
	return locksv1alpha1.QueenLockWaiter{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "999"},
		Spec: locksv1alpha1.QueenLockWaiterSpec{Lock: "l", Owner: owner, Limit: limit, Position: key}}
}

func heldAt(slot int32, owner string, expires time.Time) locksv1alpha1.QueenLock {
	e := metav1.NewMicroTime(expires)
	return locksv1alpha1.QueenLock{Spec: locksv1alpha1.QueenLockSpec{Lock: "l", Slot: slot, Owner: owner, ExpireTime: &e}}
}

// A waiter tries only at its turn: a free slot it can use and no earlier
// waiter that could use one; an earlier waiter whose limit does not reach
// the free slot is passed.
func TestTurn(t *testing.T) {
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	l := New(nil, clocktesting.NewFakePassiveClock(now), WithGrace(time.Second))
	live, gone := now.Add(time.Minute), now.Add(-2*time.Second)
	me := waiterAt("me", "me", 11, 3)
	for _, c := range []struct {
		name    string
		permits []locksv1alpha1.QueenLock
		line    []locksv1alpha1.QueenLockWaiter
		want    bool
	}{
		{"every slot held", []locksv1alpha1.QueenLock{heldAt(0, "a", live), heldAt(1, "b", live), heldAt(2, "c", live)},
			[]locksv1alpha1.QueenLockWaiter{me}, false},
		{"a slot free, first in line", []locksv1alpha1.QueenLock{heldAt(0, "a", live), heldAt(2, "c", live)},
			[]locksv1alpha1.QueenLockWaiter{me}, true},
		{"a slot free, an earlier waiter can use it", []locksv1alpha1.QueenLock{heldAt(0, "a", live), heldAt(2, "c", live)},
			[]locksv1alpha1.QueenLockWaiter{waiterAt("first", "first", 10, 2), me}, false},
		{"a slot free that the earlier waiter's limit does not reach", []locksv1alpha1.QueenLock{heldAt(0, "a", live), heldAt(2, "c", live)},
			[]locksv1alpha1.QueenLockWaiter{waiterAt("first", "first", 10, 1), me}, true},
		{"a later waiter does not count", []locksv1alpha1.QueenLock{heldAt(0, "a", live)},
			[]locksv1alpha1.QueenLockWaiter{me, waiterAt("later", "later", 12, 3)}, true},
		{"a permit expired past the grace is free", []locksv1alpha1.QueenLock{heldAt(0, "a", gone), heldAt(1, "b", live), heldAt(2, "c", live)},
			[]locksv1alpha1.QueenLockWaiter{me}, true},
		{"its own permit answers already", []locksv1alpha1.QueenLock{heldAt(0, "a", live), heldAt(1, "me", live), heldAt(2, "c", live)},
			[]locksv1alpha1.QueenLockWaiter{waiterAt("first", "first", 10, 3), me}, true},
		{"an earlier waiter already served does not count", []locksv1alpha1.QueenLock{heldAt(0, "first", live), heldAt(2, "c", live)},
			[]locksv1alpha1.QueenLockWaiter{waiterAt("first", "first", 10, 3), me}, true},
		{"its own waiter not seen yet", nil, []locksv1alpha1.QueenLockWaiter{waiterAt("first", "first", 10, 3)}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := &place{name: "me", pos: 11}
			a := &acquire{lock: "l", owner: "me", limit: 3}
			if got, _ := l.turn(fixedFollow{permits: c.permits, line: c.line}, p, a); got != c.want {
				t.Fatalf("turn = %v, want %v", got, c.want)
			}
		})
	}
}

// A waiter's own permit answers already only while it is live: one that
// expired is a slot of the line like any other. A waiter that passes one
// with a smaller limit takes no slot below that limit.
func TestTurnLeavesTheSlotsOfThoseAhead(t *testing.T) {
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	l := New(nil, clocktesting.NewFakePassiveClock(now), WithGrace(time.Second))
	live, gone := now.Add(time.Minute), now.Add(-2*time.Second)
	me := waiterAt("me", "me", 11, 3)
	p := &place{name: "me", pos: 11}

	a := &acquire{lock: "l", owner: "me", limit: 3}
	f := fixedFollow{permits: []locksv1alpha1.QueenLock{heldAt(0, "me", gone), heldAt(1, "b", live), heldAt(2, "c", live)},
		line: []locksv1alpha1.QueenLockWaiter{waiterAt("first", "first", 10, 3), me}}
	if got, _ := l.turn(f, p, a); got {
		t.Fatal("its own expired permit let it pass an earlier waiter")
	}

	a = &acquire{lock: "l", owner: "me", limit: 3}
	f = fixedFollow{permits: []locksv1alpha1.QueenLock{heldAt(0, "a", live), heldAt(2, "c", live)},
		line: []locksv1alpha1.QueenLockWaiter{waiterAt("first", "first", 10, 1), me}}
	// Slot 1 is free: the earlier waiter of limit 1 waits for slot 0, so
	// this one may try, for slot 1 and up only (slot 0 may have expired
	// by the time the try reads it).
	if got, _ := l.turn(f, p, a); !got || a.from != 1 {
		t.Fatalf("turn = %v, from = %d: want a try from slot 1", got, a.from)
	}
}
