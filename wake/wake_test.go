package wake

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

func signalled(w interface{ C() <-chan struct{} }) bool {
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
	first, _ := h.Wait("ns", "l")
	second, _ := h.Wait("ns", "l")
	other, _ := h.Wait("ns", "other")
	h.Gone(permitOf("l", time.Now()))
	if !signalled(first) || signalled(second) || signalled(other) {
		t.Fatal("want the first waiter of the lock woken, and no other")
	}
	// It did not win: the next is woken.
	first.Tried(false)
	if !signalled(second) || signalled(first) {
		t.Fatal("a loss did not pass the wake on")
	}
	// The second wins: nobody else is woken.
	second.Tried(true)
	second.Done()
	if signalled(first) {
		t.Fatal("a win woke another waiter")
	}
	// A woken waiter that leaves without trying passes its wake on.
	third, _ := h.Wait("ns", "l")
	h.Gone(permitOf("l", time.Now()))
	if !signalled(first) {
		t.Fatal("first not woken")
	}
	first.Done()
	if !signalled(third) {
		t.Fatal("an unused wake was lost")
	}
	third.Done()
	other.Done()
	if h.Waiting() != 0 || len(h.locks) != 0 {
		t.Fatalf("%d waiting, %d locks kept", h.Waiting(), len(h.locks))
	}
}

func TestCapAndExpiryTimer(t *testing.T) {
	h := NewHub(1, 10*time.Millisecond, nil)
	w, ok := h.Wait("ns", "l")
	if !ok {
		t.Fatal("refused under the cap")
	}
	if _, ok := h.Wait("ns", "l"); ok {
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
