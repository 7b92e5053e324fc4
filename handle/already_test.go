package handle_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/queen-locks/queen-locks/handle"
)

// An acquire lands but its answer is lost; the retry comes later and is
// answered already. The lease runs from the first acquire, and the answer's
// expiresAt is on the server's clock, here an hour ahead of ours (our clock
// is behind): the handle must still give up before the server's expiry.
func TestAlreadyAnswerNeverOutlivesTheServersExpiry(t *testing.T) {
	ns := namespace(t)
	url, _ := startRoute(t, ns)
	s := &spy{Transport: handle.HTTP(url, handle.HTTPOptions{}), shift: time.Hour}
	s.dropAcquires.Store(1)
	// 2.5 s counted here, 3 s (whole seconds) by the server from a later
	// moment: half a second for the timer to fire before the server's expiry.
	h := handle.New(s).Lock("skewed", 2500*time.Millisecond)
	lostAt := make(chan time.Time, 1)
	h.OnLost(func(r string) {
		if r == handle.LostExpired {
			lostAt <- time.Now()
		}
	})
	ctx := context.Background()
	if ok, err := h.Acquire(ctx); ok || !errors.Is(err, errDropped) {
		t.Fatalf("first acquire: %v %v", ok, err)
	}
	// The scenario itself: the retry comes well into the first lease, so a
	// deadline counted from the retry outlives that lease.
	time.Sleep(1500 * time.Millisecond)
	if ok, err := h.Acquire(ctx); !ok || err != nil {
		t.Fatalf("retry: %v %v", ok, err)
	}
	// The rule: an already answer is renewed at once, and the deadline
	// counted from when that renew was sent.
	if n := s.renews.Load(); n != 1 {
		t.Fatalf("%d renews after the already answer, want 1", n)
	}
	p := stored(t, ns, "skewed", 0)
	if p == nil || p.Spec.Owner != h.Owner() || p.Spec.ExpireTime == nil {
		t.Fatalf("stored permit %v", p)
	}
	s.failRenews.Store(true) // the server becomes unreachable for renews
	select {
	case at := <-lostAt:
		// Both times are this machine's clock: the webhook stamped the
		// expiry with it.
		if !at.Before(p.Spec.ExpireTime.Time) {
			t.Fatalf("the handle gave up at %v, after the server's expiry %v", at, p.Spec.ExpireTime.Time)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the handle never gave up")
	}
}

// The other skew: the server's clock is an hour behind ours, so its
// expiresAt already lies in our past. The handle must not count that as
// expired: it holds and renews as usual.
func TestAlreadyAnswerFromAServerClockBehindOursHolds(t *testing.T) {
	ns := namespace(t)
	url, _ := startRoute(t, ns)
	s := &spy{Transport: handle.HTTP(url, handle.HTTPOptions{}), shift: -time.Hour}
	s.dropAcquires.Store(1)
	h := handle.New(s).Lock("behind", time.Second)
	renewed := make(chan uint64, 16)
	h.OnRenew(func(tok uint64) { renewed <- tok })
	ctx := context.Background()
	if _, err := h.Acquire(ctx); !errors.Is(err, errDropped) {
		t.Fatal(err)
	}
	if ok, err := h.Acquire(ctx); !ok || err != nil {
		t.Fatalf("retry: %v %v", ok, err)
	}
	// Two background renews: the handle outlived the server's expiresAt
	// as we read it and one TTL.
	for range 2 {
		select {
		case <-renewed:
		case <-time.After(30 * time.Second):
			t.Fatal("no background renew")
		}
	}
	if !h.Held() {
		t.Fatalf("lost: %s", h.Reason())
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
