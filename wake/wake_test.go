package wake

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

func signalled(w interface{ C() <-chan int }) bool {
	select {
	case <-w.C():
		return true
	default:
		return false
	}
}

func permitOf(lock string, expires time.Time) *locksv1alpha1.QueenLock {
	e := metav1.NewMicroTime(expires)
	return &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: lock + ".0"},
		Spec: locksv1alpha1.QueenLockSpec{Lock: lock, ExpireTime: &e}}
}

func TestOneFreeSlotWakesTheLongestWaiterOnly(t *testing.T) {
	h := NewHub(10, 0, nil)
	first, _ := h.Wait("ns", "l", 1)
	second, _ := h.Wait("ns", "l", 1)
	other, _ := h.Wait("ns", "other", 1)
	h.Gone(permitOf("l", time.Now()))
	if !signalled(first) || signalled(second) || signalled(other) {
		t.Fatal("want the first waiter of the lock woken, and no other")
	}
	// It lost to somebody else: the slot is taken, nobody else is woken.
	first.Tried(false)
	if signalled(second) || signalled(first) {
		t.Fatal("a lost try passed the wake on")
	}
	// The next free slot wakes the first again, the longest waiting.
	h.Gone(permitOf("l", time.Now()))
	if !signalled(first) || signalled(second) {
		t.Fatal("want the first waiter woken again")
	}
	first.Tried(true)
	first.Done()
	if signalled(second) {
		t.Fatal("a win woke another waiter")
	}
	// A woken waiter that leaves without saying how its try went (it
	// failed, or the caller left) passes its wake on.
	third, _ := h.Wait("ns", "l", 1)
	h.Gone(permitOf("l", time.Now()))
	if !signalled(second) {
		t.Fatal("second not woken")
	}
	second.Done()
	if !signalled(third) {
		t.Fatal("an unused wake was lost")
	}
	third.Done()
	other.Done()
	if h.Waiting() != 0 || len(h.locks) != 0 {
		t.Fatalf("%d waiting, %d locks kept", h.Waiting(), len(h.locks))
	}
}

func TestASlotFreedWhileEveryWaiterTriesIsNotLost(t *testing.T) {
	h := NewHub(10, 0, nil)
	w, _ := h.Wait("ns", "l", 1)
	h.Gone(permitOf("l", time.Now()))
	if !signalled(w) {
		t.Fatal("not woken")
	}
	// While its try is in flight, another permit goes: nobody is idle.
	h.Gone(permitOf("l", time.Now()))
	w.Tried(false)
	if !signalled(w) {
		t.Fatal("the wake that came during the try was lost")
	}
	w.Tried(false)
	if signalled(w) {
		t.Fatal("one missed wake woke twice")
	}
	w.Done()
}

func TestALostTryWakesOnlyAWiderWaiter(t *testing.T) {
	h := NewHub(10, 0, nil)
	narrow, _ := h.Wait("ns", "s", 2)
	same, _ := h.Wait("ns", "s", 2)
	wide, _ := h.Wait("ns", "s", 4)
	h.Gone(permitOf("s", time.Now()))
	if !signalled(narrow) {
		t.Fatal("the longest waiter not woken")
	}
	// Slots 0 and 1 are held; the freed slot may be beyond its limit.
	narrow.Tried(false)
	if signalled(same) || !signalled(wide) {
		t.Fatal("want the wake passed to the waiter of a larger limit only")
	}
	wide.Tried(false)
	if signalled(same) || signalled(narrow) {
		t.Fatal("a lost try of the widest waiter woke somebody")
	}
	// A lost first try, not woken by anything, wakes nobody.
	late, _ := h.Wait("ns", "s", 1)
	late.Tried(false)
	if signalled(wide) || signalled(same) {
		t.Fatal("a first try woke somebody")
	}
	for _, w := range []interface{ Done() }{narrow, same, wide, late} {
		w.Done()
	}
}

func TestCapAndExpiryTimer(t *testing.T) {
	h := NewHub(1, 10*time.Millisecond, nil)
	w, ok := h.Wait("ns", "l", 1)
	if !ok {
		t.Fatal("refused under the cap")
	}
	if _, ok := h.Wait("ns", "l", 1); ok {
		t.Fatal("admitted past the cap")
	}
	h.Seen(permitOf("l", time.Now().Add(20*time.Millisecond)))
	select {
	case <-w.C():
	case <-time.After(10 * time.Second):
		t.Fatal("not woken at expireTime plus the grace")
	}
	w.Done()
}

func TestAWakeNamesTheSlotThatFreed(t *testing.T) {
	h := NewHub(10, 0, nil)
	w, _ := h.Wait("ns", "s", 4)
	p := permitOf("s", time.Now())
	p.Spec.Slot = 2
	h.Gone(p)
	select {
	case slot := <-w.C():
		if slot != 2 {
			t.Fatalf("woken with slot %d, want 2", slot)
		}
	default:
		t.Fatal("not woken")
	}
	w.Done()
}
