package handle_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/permit"
)

func namespace(t *testing.T) string {
	t.Helper()
	return env.Namespace(t, "handle")
}

// transports runs f once over the route and once straight over the API.
func transports(t *testing.T, f func(t *testing.T, ns string, tr handle.Transport)) {
	t.Helper()
	t.Run("http", func(t *testing.T) {
		ns := namespace(t)
		url, _ := startRoute(t, ns)
		f(t, ns, handle.HTTP(url, handle.HTTPOptions{}))
	})
	t.Run("kube", func(t *testing.T) {
		ns := namespace(t)
		f(t, ns, handle.Kube(env.Client, ns))
	})
}

func stored(t *testing.T, ns, lock string, slot int) *locksv1alpha1.QueenLock {
	t.Helper()
	p := &locksv1alpha1.QueenLock{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: permit.Name(lock, slot)}, p); err != nil {
		return nil
	}
	return p
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func TestAcquireRelease(t *testing.T) {
	transports(t, func(t *testing.T, ns string, tr handle.Transport) {
		ctx := context.Background()
		c := handle.New(tr)
		a, b := c.Lock("job", 30*time.Second), c.Lock("job", 30*time.Second)
		if ok, err := a.Acquire(ctx); !ok || err != nil {
			t.Fatalf("a: %v %v", ok, err)
		}
		if p := stored(t, ns, "job", 0); p == nil || p.ResourceVersion != permit.ResourceVersion(a.Token()) || p.Spec.Owner != a.Owner() {
			t.Fatalf("stored %v; handle token %d owner %s", p, a.Token(), a.Owner())
		}
		if ok, err := b.Acquire(ctx); ok || err != nil || b.Reason() != "held" || len(b.Holders()) != 1 {
			t.Fatalf("b: %v %v reason %q holders %v", ok, err, b.Reason(), b.Holders())
		}
		if err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(context.Cause(a.Context()), handle.ErrReleased) {
			t.Fatalf("cause after release: %v", context.Cause(a.Context()))
		}
		if ok, err := b.Acquire(ctx); !ok || err != nil {
			t.Fatalf("b after release: %v %v", ok, err)
		}
		g := b.Guard()
		if g.Key != "job#0" || g.Expect != b.Token() || g.Op != "check" || !g.Required {
			t.Fatalf("guard %+v", g)
		}
		if ok, err := b.Check(ctx); !ok || err != nil {
			t.Fatalf("check: %v %v", ok, err)
		}
		_ = b.Release(ctx)
	})
}

func TestBackgroundRenewKeepsALockLongerThanItsTTL(t *testing.T) {
	transports(t, func(t *testing.T, ns string, tr handle.Transport) {
		ctx := context.Background()
		h := handle.New(tr).Lock("long-job", time.Second)
		var renewals atomic.Int32
		h.OnRenew(func(uint64) { renewals.Add(1) })
		if ok, err := h.Acquire(ctx); !ok || err != nil {
			t.Fatal(ok, err)
		}
		first := h.Token()
		// Six renewals at a third of a second each outlive the TTL twice over.
		eventually(t, "six renewals", func() bool { return renewals.Load() >= 6 })
		if !h.Held() || h.Token() <= first {
			t.Fatalf("held %v token %d after %d", h.Held(), h.Token(), first)
		}
		if p := stored(t, ns, "long-job", 0); p == nil || p.Spec.Owner != h.Owner() {
			t.Fatalf("the permit is gone or changed hands: %v", p)
		}
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if stored(t, ns, "long-job", 0) != nil {
			t.Fatal("released permit still stored")
		}
	})
}

func TestDeletingThePermitLosesItWithReasonRenew(t *testing.T) {
	transports(t, func(t *testing.T, ns string, tr handle.Transport) {
		ctx := context.Background()
		h := handle.New(tr).Lock("deleted", 3*time.Second)
		reasons := make(chan string, 1)
		h.OnLost(func(r string) { reasons <- r })
		if ok, err := h.Acquire(ctx); !ok || err != nil {
			t.Fatal(ok, err)
		}
		lost := h.Lost()
		if err := env.Client.Delete(ctx, stored(t, ns, "deleted", 0)); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-reasons:
			if r != handle.LostRenew {
				t.Fatalf("reason %q", r)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the loss was never reported")
		}
		<-lost
		if !errors.Is(context.Cause(h.Context()), handle.ErrLost) || h.Held() {
			t.Fatalf("cause %v held %v", context.Cause(h.Context()), h.Held())
		}
	})
}

// A server that stops answering: the handle must assume the worst once the
// TTL has passed since the last renew that got through was sent.
func TestUnreachableServerLosesItWithReasonExpired(t *testing.T) {
	ns := namespace(t)
	url, stop := startRoute(t, ns)
	h := handle.New(handle.HTTP(url, handle.HTTPOptions{})).Lock("cut-off", 2*time.Second)
	var lastSent atomic.Int64
	h.OnRenew(func(uint64) { lastSent.Store(time.Now().UnixNano()) })
	lostAt := make(chan time.Time, 1)
	h.OnLost(func(r string) {
		if r == handle.LostExpired {
			lostAt <- time.Now()
		}
	})
	acquired := time.Now()
	if ok, err := h.Acquire(context.Background()); !ok || err != nil {
		t.Fatal(ok, err)
	}
	eventually(t, "a renew", func() bool { return lastSent.Load() != 0 })
	stop()
	stoppedAt := time.Now()
	select {
	case at := <-lostAt:
		// The renew that got through was sent before OnRenew saw its answer,
		// so its deadline is no later than that moment plus the TTL. Allow a
		// second of scheduling delay on a busy machine.
		limit := time.Unix(0, lastSent.Load()).Add(2*time.Second + time.Second)
		if at.After(limit) || at.Before(acquired.Add(2*time.Second)) {
			t.Fatalf("lost at %v: stopped at %v, last renew answered at %v", at, stoppedAt, time.Unix(0, lastSent.Load()))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the handle never gave up")
	}
	if h.Held() || h.Reason() != handle.LostExpired {
		t.Fatalf("held %v reason %q", h.Held(), h.Reason())
	}
}

func TestRunWaitsForTheHolderAndGivesUpWhenTheWaitEnds(t *testing.T) {
	transports(t, func(t *testing.T, ns string, tr handle.Transport) {
		ctx := context.Background()
		c := handle.New(tr)
		holder := c.Lock("turn", 30*time.Second)
		if ok, _ := holder.Acquire(ctx); !ok {
			t.Fatal("holder did not acquire")
		}
		// A short wait against a held lock gives up without running.
		ran := false
		ok, err := c.Lock("turn", 30*time.Second).Run(ctx, func(context.Context) error { ran = true; return nil }, handle.Wait(300*time.Millisecond))
		if ok || ran || err != nil {
			t.Fatalf("short wait: acquired %v ran %v err %v", ok, ran, err)
		}
		// A long wait gets it once the holder releases.
		var wg sync.WaitGroup
		var got bool
		var runErr error
		waiter := c.Lock("turn", 30*time.Second)
		wg.Go(func() {
			got, runErr = waiter.Run(ctx, func(ctx context.Context) error {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return errors.New("the job's own error")
			}, handle.Wait(20*time.Second))
		})
		eventually(t, "the waiter to find the lock held", func() bool { return waiter.Reason() == "held" })
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if !got || runErr == nil || runErr.Error() != "the job's own error" {
			t.Fatalf("waiter: acquired %v err %v", got, runErr)
		}
		if stored(t, ns, "turn", 0) != nil {
			t.Fatal("Run did not release")
		}
	})
}

func TestSemaphoreHandlesTakeDistinctSlots(t *testing.T) {
	transports(t, func(t *testing.T, ns string, tr handle.Transport) {
		ctx := context.Background()
		c := handle.New(tr)
		slots := map[int]bool{}
		for range 3 {
			h := c.Semaphore("pool", 3, 30*time.Second)
			if ok, err := h.Acquire(ctx); !ok || err != nil {
				t.Fatal(ok, err)
			}
			slots[h.Slot()] = true
			defer func() { _ = h.Release(ctx) }()
		}
		if len(slots) != 3 {
			t.Fatalf("slots %v", slots)
		}
		if ok, _ := c.Semaphore("pool", 3, 30*time.Second).Acquire(ctx); ok {
			t.Fatal("a fourth holder of a semaphore of 3")
		}
	})
}

func TestAFailedGuardLosesTheLockWithReasonGuard(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	h := handle.New(handle.Kube(env.Client, ns)).Lock("guarded", 30*time.Second)
	reasons := make(chan string, 1)
	h.OnLost(func(r string) { reasons <- r })
	if ok, err := h.Acquire(ctx); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := h.Check(ctx); !ok || err != nil {
		t.Fatalf("check with the current token: %v %v", ok, err)
	}
	// The permit moves on without this handle knowing (here: an operator's
	// write as the same owner), so the handle's token is no longer current.
	p := stored(t, ns, "guarded", 0)
	if err := env.Client.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	if ok, err := h.Check(ctx); ok || err != nil {
		t.Fatalf("check with a stale token: %v %v", ok, err)
	}
	if r := <-reasons; r != handle.LostGuard || h.Held() {
		t.Fatalf("reason %q held %v", r, h.Held())
	}
}

// Run's wait is woken, not polled: over the route the call waits on the
// route's hub, over the API the handle watches the lock's permits.
func TestRunIsWokenWhenTheHolderReleases(t *testing.T) {
	transports(t, func(t *testing.T, ns string, tr handle.Transport) {
		ctx := context.Background()
		c := handle.New(tr)
		holder := c.Lock("woken", 30*time.Second)
		if ok, _ := holder.Acquire(ctx); !ok {
			t.Fatal("holder did not acquire")
		}
		waiter := c.Lock("woken", 30*time.Second)
		done := make(chan bool, 1)
		go func() {
			ok, _ := waiter.Run(ctx, func(context.Context) error { return nil }, handle.Wait(60*time.Second))
			done <- ok
		}()
		eventually(t, "the waiter to find the lock held", func() bool { return waiter.Reason() == "held" })
		if _, isHTTP := tr.(interface{ Namespace() string }); isHTTP && env.Waker != nil && tr.Namespace() == "" {
			eventually(t, "the call to wait on the route", func() bool { return env.Waker.Waiting() > 0 })
		}
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		// The waiter's own wait per call is 10 s (a third of its TTL);
		// woken, it answers long before that call would have ended.
		select {
		case ok := <-done:
			if !ok {
				t.Fatal("the waiter did not get the lock")
			}
		case <-time.After(8 * time.Second):
			t.Fatal("the waiter was not woken when the holder released")
		}
	})
}
