package waiters

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
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
	first, _ := h.Wait("ns", "l", "", 1)
	second, _ := h.Wait("ns", "l", "", 1)
	other, _ := h.Wait("ns", "other", "", 1)
	h.Gone(permitOf("l", time.Now()))
	if !signalled(first) || signalled(second) || signalled(other) {
		t.Fatal("want the first waiter of the lock woken, and no other")
	}
	// It lost to somebody else: the slot is taken, nobody else is woken.
	first.Tried(false, -1)
	if signalled(second) || signalled(first) {
		t.Fatal("a lost try passed the wake on")
	}
	// The next free slot wakes the first again, the longest waiting.
	h.Gone(permitOf("l", time.Now()))
	if !signalled(first) || signalled(second) {
		t.Fatal("want the first waiter woken again")
	}
	first.Tried(true, 0)
	first.Done()
	if signalled(second) {
		t.Fatal("a win woke another waiter")
	}
	// A woken waiter that leaves without saying how its try went (it
	// failed, or the caller left) passes its wake on.
	third, _ := h.Wait("ns", "l", "", 1)
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
	w, _ := h.Wait("ns", "l", "", 1)
	h.Gone(permitOf("l", time.Now()))
	if !signalled(w) {
		t.Fatal("not woken")
	}
	// While its try is in flight, another permit goes: nobody is idle.
	h.Gone(permitOf("l", time.Now()))
	w.Tried(false, -1)
	if !signalled(w) {
		t.Fatal("the wake that came during the try was lost")
	}
	w.Tried(false, -1)
	if signalled(w) {
		t.Fatal("one missed wake woke twice")
	}
	w.Done()
}

func TestALostTryWakesOnlyAWiderWaiter(t *testing.T) {
	h := NewHub(10, 0, nil)
	narrow, _ := h.Wait("ns", "s", "", 2)
	same, _ := h.Wait("ns", "s", "", 2)
	wide, _ := h.Wait("ns", "s", "", 4)
	h.Gone(permitOf("s", time.Now()))
	if !signalled(narrow) {
		t.Fatal("the longest waiter not woken")
	}
	// Slots 0 and 1 are held; the freed slot may be beyond its limit.
	narrow.Tried(false, -1)
	if signalled(same) || !signalled(wide) {
		t.Fatal("want the wake passed to the waiter of a larger limit only")
	}
	wide.Tried(false, -1)
	if signalled(same) || signalled(narrow) {
		t.Fatal("a lost try of the widest waiter woke somebody")
	}
	// A lost first try, not woken by anything, wakes nobody.
	late, _ := h.Wait("ns", "s", "", 1)
	late.Tried(false, -1)
	if signalled(wide) || signalled(same) {
		t.Fatal("a first try woke somebody")
	}
	for _, w := range []interface{ Done() }{narrow, same, wide, late} {
		w.Done()
	}
}

func TestCapAndExpiryTimer(t *testing.T) {
	h := NewHub(1, 10*time.Millisecond, nil)
	w, ok := h.Wait("ns", "l", "", 1)
	if !ok {
		t.Fatal("refused under the cap")
	}
	if _, ok := h.Wait("ns", "l", "", 1); ok {
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
	w, _ := h.Wait("ns", "s", "", 4)
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

func slotOf(lock string, slot int) *locksv1alpha1.QueenLock {
	p := permitOf(lock, time.Now().Add(time.Hour))
	p.Name = fmt.Sprintf("%s.%d", lock, slot)
	p.Spec.Slot = int32(slot)
	return p
}

// A narrow waiter woken by a slot beyond its limit passes the wake to a
// wider waiter; if that one is trying already (on a read from before the
// slot freed), the wake is kept for when its try ends.
func TestAWakeForAWiderWaiterThatIsTryingIsKept(t *testing.T) {
	h := NewHub(10, 0, nil)
	n, _ := h.Wait("ns", "s", "", 1)
	w, _ := h.Wait("ns", "s", "", 3)
	n.Tried(false, -1)
	w.Tried(false, -1)
	h.Gone(slotOf("s", 1))
	if !signalled(n) {
		t.Fatal("n not woken")
	}
	n.Tried(false, -1)
	if !signalled(w) {
		t.Fatal("w not woken")
	}
	// Somebody else took slot 1; before w's try ends, slot 2 frees.
	h.Gone(slotOf("s", 2))
	if !signalled(n) {
		t.Fatal("n not woken by slot 2")
	}
	n.Tried(false, -1) // slot 0 is held; w is trying
	w.Tried(false, -1) // its read was from before slot 2 freed
	awakeUntilTheWideOneTries(t, n, w)
}

// A wake that came while every waiter was trying is spent on the longest
// waiter, which may be too narrow to see the slot: it is then passed on
// once the wider one's try ends.
func TestAMissedWakeReachesTheWiderWaiter(t *testing.T) {
	h := NewHub(10, 0, nil)
	n, _ := h.Wait("ns", "s", "", 1)
	w, _ := h.Wait("ns", "s", "", 3)
	n.Tried(false, -1)
	w.Tried(false, -1)
	h.Gone(slotOf("s", 0))
	h.Gone(slotOf("s", 1))
	if !signalled(n) || !signalled(w) {
		t.Fatal("not both woken")
	}
	h.Gone(slotOf("s", 2)) // every waiter is trying: missed
	n.Tried(false, -1)
	if !signalled(n) {
		t.Fatal("n not woken again")
	}
	n.Tried(false, -1) // slot 0 is held; w is trying
	w.Tried(false, -1) // its read was from before slot 2 freed
	awakeUntilTheWideOneTries(t, n, w)
}

// awakeUntilTheWideOneTries follows the wakes after both have lost, with
// the narrow one losing each try, until the wide one is woken; a wake that
// goes nowhere before that is a lost wake-up.
func awakeUntilTheWideOneTries(t *testing.T, n, w locks.Waiter) {
	t.Helper()
	for range 4 {
		switch {
		case signalled(w):
			return
		case signalled(n):
			n.Tried(false, -1)
		default:
			t.Fatal("lost wake-up: slot 2 is free and nobody who can take it was woken")
		}
	}
	t.Fatal("the wakes went round without reaching the wide waiter")
}

// A permit written for a waiter's own owner wakes that waiter, before any
// that waited longer: it holds a slot the cache it skipped its try on had
// not seen yet (a retry of an acquire won on another replica), and its try
// answers already.
func TestAPermitOfTheWaitersOwnerWakesIt(t *testing.T) {
	h := NewHub(10, 0, nil)
	longer, _ := h.Wait("ns", "l", "a", 1)
	mine, _ := h.Wait("ns", "l", "b", 1)
	p := permitOf("l", time.Now().Add(time.Minute))
	p.Spec.Owner = "b"
	h.Seen(p)
	if !signalled(mine) || signalled(longer) {
		t.Fatal("want the waiter of owner b woken, and no other")
	}
	// Another owner's permit wakes nobody before its expiry.
	p.Spec.Owner = "c"
	h.Seen(p)
	if signalled(mine) || signalled(longer) {
		t.Fatal("a permit of another owner woke a waiter")
	}
	longer.Done()
	mine.Done()
}

// Permits reads the hub's lister; a hub without one says so.
func TestPermitsReadTheLister(t *testing.T) {
	none, _ := NewHub(10, 0, nil).Wait("ns", "l", "a", 1)
	if _, ok := none.(locks.Cached).Permits(); ok {
		t.Fatal("a hub without a lister answered permits")
	}
	var asked []string
	h := NewHub(10, 0, func(ns, lock string) []locksv1alpha1.QueenLock {
		asked = append(asked, ns+"/"+lock)
		return []locksv1alpha1.QueenLock{*permitOf(lock, time.Now().Add(time.Minute))}
	})
	w, _ := h.Wait("ns", "l", "a", 1)
	ps, ok := w.(locks.Cached).Permits()
	if !ok || len(ps) != 1 || ps[0].Spec.Lock != "l" || asked[len(asked)-1] != "ns/l" {
		t.Fatalf("permits %+v %v, lister asked %v", ps, ok, asked)
	}
	w.Done()
}

// A waiter woken between its queueing and its skipped first try tries
// after all, its wake kept; one that was not sleeps as after a lost try.
func TestSleepRefusesAWokenWaiter(t *testing.T) {
	h := NewHub(10, 0, nil)
	w, _ := h.Wait("ns", "l", "a", 1)
	h.Gone(permitOf("l", time.Now()))
	if w.(locks.Cached).Sleep(nil) {
		t.Fatal("a woken waiter went to sleep")
	}
	if !signalled(w) {
		t.Fatal("the wake was lost")
	}
	w.Tried(false, -1)
	other, _ := h.Wait("ns", "l", "b", 1)
	if !other.(locks.Cached).Sleep(nil) || h.Asleep() != 2 {
		t.Fatalf("a waiter nobody woke did not sleep: %d asleep", h.Asleep())
	}
	w.Done()
	other.Done()
}

// A newcomer sleeps on free slots only while each has a waiter woken for
// that slot trying it: a waiter woken for no slot (a missed wake, a permit
// of its own owner), or for a slot that is not among the free ones (its
// own try took it meanwhile), speaks for none.
func TestSleepLeavesFreeSlotsOnlyToWaitersWokenForThem(t *testing.T) {
	h := NewHub(10, 0, nil)
	aimed, _ := h.Wait("ns", "s", "a", 4)
	h.Gone(permitOf("s", time.Now())) // slot 0 freed: aimed tries it
	newcomer, _ := h.Wait("ns", "s", "b", 4)
	if newcomer.(locks.Cached).Sleep([]int{0, 1}) {
		t.Fatal("a newcomer slept on two free slots with one waiter trying")
	}
	if newcomer.(locks.Cached).Sleep([]int{1}) {
		t.Fatal("a newcomer slept on a free slot that the woken waiter is not trying (its own try took another)")
	}
	if !newcomer.(locks.Cached).Sleep([]int{0}) {
		t.Fatal("a newcomer tried a free slot that a woken waiter is trying")
	}
	aimed.Tried(true, 0)
	unaimed, _ := h.Wait("ns", "s", "c", 4)
	h.Seen(&locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s.1"},
		Spec: locksv1alpha1.QueenLockSpec{Lock: "s", Owner: "c", Slot: 1}}) // unaimed's own permit: it tries to answer already
	late, _ := h.Wait("ns", "s", "d", 4)
	if late.(locks.Cached).Sleep([]int{2}) {
		t.Fatal("a waiter woken for no slot was counted as trying a free one")
	}
	for _, w := range []locks.Waiter{aimed, newcomer, unaimed, late} {
		w.Done()
	}
}

// A wake that comes during a try that then wins is passed on: the try
// may have taken another slot, and the freed one must not stay free while
// others sleep.
func TestAWakeDuringAWinningTryIsPassedOn(t *testing.T) {
	h := NewHub(10, 0, nil)
	trying, _ := h.Wait("ns", "s", "a", 4)
	asleep, _ := h.Wait("ns", "s", "b", 4)
	asleep.(locks.Cached).Sleep(nil)
	h.Gone(permitOf("s", time.Now())) // goes to trying, first in line and not yet woken
	if signalled(asleep) {
		t.Fatal("the wake went past the first in line")
	}
	trying.Tried(true, 1) // it took slot 1; slot 0 freed meanwhile
	if !signalled(asleep) {
		t.Fatal("the wake that came during the winning try was not passed on")
	}
	trying.Done()
	asleep.Tried(false, -1)
	// A wake for the very slot the try took is used up.
	again, _ := h.Wait("ns", "s", "c", 4)
	h.Gone(permitOf("s", time.Now())) // slot 0, to asleep, first in line now, during a try of its own
	asleep.Tried(true, 0)
	if signalled(again) {
		t.Fatal("a wake for the slot the try took was passed on")
	}
	asleep.Done()
	again.Done()
}

// A permit of the waiter's owner written while it tries sends it, once
// that try is lost, to try again; and a lock's waiter is not woken by its owner's permit on a
// slot a lock never reads.
func TestAPermitOfTheOwnerDuringATryIsNotLost(t *testing.T) {
	h := NewHub(10, 0, nil)
	w, _ := h.Wait("ns", "l", "a", 1)
	h.Gone(permitOf("l", time.Now()))
	if !signalled(w) {
		t.Fatal("not woken")
	}
	p := permitOf("l", time.Now().Add(time.Minute))
	p.Spec.Owner = "a"
	h.Seen(p) // while its try is in flight
	w.Tried(false, -1)
	if !signalled(w) {
		t.Fatal("a lost try after its owner's permit was written does not try again")
	}
	w.Tried(false, -1)
	high := permitOf("l", time.Now().Add(time.Minute))
	high.Name, high.Spec.Owner, high.Spec.Slot = "l.3", "a", 3
	h.Seen(high)
	if signalled(w) {
		t.Fatal("a lock's waiter was woken by its owner's permit on slot 3")
	}
	w.Done()
}

// Until its feed has reported every cached permit, a hub answers no
// permits, so that no waiter sleeps on a cache whose changes it would
// not hear of.
func TestPermitsWaitForTheFeed(t *testing.T) {
	h := NewHub(10, 0, func(string, string) []locksv1alpha1.QueenLock { return nil })
	h.ready.Store(false)
	w, _ := h.Wait("ns", "l", "a", 1)
	if _, ok := w.(locks.Cached).Permits(); ok {
		t.Fatal("permits answered before the feed was ready")
	}
	h.ready.Store(true)
	if _, ok := w.(locks.Cached).Permits(); !ok {
		t.Fatal("no permits once the feed was ready")
	}
	w.Done()
}
