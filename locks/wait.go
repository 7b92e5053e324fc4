package locks

import (
	"context"
	"fmt"
	"time"
)

// Waker tells a waiting acquire when a permit of its lock may have freed.
type Waker interface {
	// Wait queues a waiter for a semaphore of limit; false when no more
	// may wait.
	Wait(ns, lock string, limit int) (Waiter, bool)
}

// Waiter is one queued acquire.
type Waiter interface {
	// C is signalled when a slot may have freed, with that slot when it
	// is known and -1 otherwise.
	C() <-chan int
	// Tried says how a try went: won, or lost to a holder. A try that
	// failed otherwise is not reported.
	Tried(won bool)
	// Done leaves the queue.
	Done()
}

// WaitUpTo lets an acquire wait up to d for a slot to free, woken by w.
// When w has no room for another waiter, the acquire answers at once.
func WaitUpTo(d time.Duration, w Waker) AcquireOption {
	return func(c *acquireConfig) { c.wait, c.waker = d, w }
}

// tryTimeout bounds one try of a waiting acquire, which runs to its end
// even when the caller goes away, so that what it won can be given back.
const tryTimeout = 15 * time.Second

// acquireWaiting tries, and while the lock is held waits for a wake and
// tries again, until it wins or the wait is over; then it answers as a
// plain acquire would. The waiter is queued before the first try, so a
// release between that try and the wait is not missed.
//
// A caller that went away never acquires: each try runs to its end on its
// own, and a permit won by a try the caller no longer waits for is
// released at once.
func (l *Client) acquireWaiting(ctx context.Context, a *acquire) (Acquired, error) {
	w, ok := a.waker.Wait(a.ns, a.lock, a.limit)
	if !ok {
		// No room to wait: one try, which a caller going away does not
		// cut short, so that a permit it won is given back, not left
		// held until its TTL.
		return l.try(ctx, a)
	}
	defer w.Done()
	deadline := time.NewTimer(a.wait)
	defer deadline.Stop()
	last := false
	for {
		if err := ctx.Err(); err != nil {
			return Acquired{}, err
		}
		got, err := l.try(ctx, a)
		lost := err == nil && (got.Reason == ReasonHeld || got.Reason == ReasonContended)
		if err == nil && (got.Acquired || lost) {
			w.Tried(got.Acquired)
		}
		if last || !lost {
			return got, err
		}
		select {
		case a.freed = <-w.C():
		case <-deadline.C:
			last = true
		case <-ctx.Done():
			return Acquired{}, ctx.Err()
		}
	}
}

// try is one acquire that the caller's going away does not cut short.
func (l *Client) try(ctx context.Context, a *acquire) (Acquired, error) {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tryTimeout)
	defer cancel()
	got, err := l.acquireOnce(tctx, a)
	if err == nil && got.Acquired && !got.Already && ctx.Err() != nil {
		// Nobody waits for this answer any more: give the slot back.
		if _, rerr := l.Release(tctx, a.ns, a.lock, got.Slot, got.Token, a.owner); rerr != nil {
			return Acquired{}, fmt.Errorf("the caller went away while acquiring lock %q, and releasing the slot it won failed: %w", a.lock, rerr)
		}
		return Acquired{}, ctx.Err()
	}
	return got, err
}
