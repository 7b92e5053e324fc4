package locks

import (
	"context"
	"fmt"
	"time"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// Waker tells a waiting acquire when a permit of its lock may have freed.
type Waker interface {
	// Wait queues a waiter of owner for a semaphore of limit; false when
	// no more may wait. A write of a permit of owner wakes the waiter:
	// its acquire then answers already.
	Wait(ns, lock, owner string, limit int) (Waiter, bool)
}

// Waiter is one queued acquire.
type Waiter interface {
	// C is signalled when a slot may have freed, with that slot when it
	// is known and -1 otherwise.
	C() <-chan int
	// Tried says how a try went: won, with the slot it took, or lost to
	// a holder (slot -1). A try that failed otherwise is not reported.
	Tried(won bool, slot int)
	// Done leaves the queue.
	Done()
}

// Cached is a Waiter that can read its lock's permits as the watch that
// wakes it has them.
type Cached interface {
	// Permits answers the lock's permits in that watch's cache; false
	// when there is no cache to read.
	Permits() ([]locksv1alpha1.QueenLock, bool)
	// Sleep puts the waiter to sleep without a try, as after a lost one,
	// when each slot that the cache showed free (none, or a few) is being
	// tried by a waiter woken for it; false when it must try all the same
	// (it was woken meanwhile, or a free slot has no such waiter).
	Sleep(free []int) bool
}

// WaitUpTo lets an acquire wait up to d for a slot to free, woken by w.
// When w has no room for another waiter, the acquire answers at once.
func WaitUpTo(d time.Duration, w Waker) AcquireOption {
	return func(c *acquireConfig) { c.wait, c.waker = d, w }
}

// KeepWhenGone makes a waiting acquire answer a slot it won after its
// caller went away, rather than give it back: the caller decides. The
// route uses it, and gives back only acquires whose owner it minted: a
// caller that named its owner may have retried elsewhere (another replica)
// and been answered already with the very permit a give-back would delete.
func KeepWhenGone() AcquireOption {
	return func(c *acquireConfig) { c.keep = true }
}

// tryTimeout bounds one try of a waiting acquire, which runs to its end
// even when the caller goes away, so that what it won can be given back.
const tryTimeout = 15 * time.Second

// acquireWaiting tries, and while the lock is held waits for a wake and
// tries again, until it wins or the wait is over; then it answers as a
// plain acquire would. The waiter is queued before the first try, so a
// release between that try and the wait is not missed.
//
// When the waker's cache shows every slot held by another owner's live
// permit, the first try is not sent: it could only lose, and a semaphore
// with many waiters would spend most of its writes on such tries (each
// arrival a create that fails and a list), slowing the handoffs they
// compete with. Skipping is safe because the cache is read after the
// waiter is queued, and the same watch that fills the cache wakes the
// waiter: a slot that frees after the read wakes it, and a permit of its
// own owner that the cache has not seen yet (a retry of an acquire that
// won on another replica) wakes it too, to answer already. The same
// holds when the cache shows a few slots free but each is being tried by
// a waiter woken for that slot (see the Cached's Sleep): the newcomer
// would race them for those slots, and the loser's create and list would
// be spent for nothing.
//
// A caller that went away never acquires: each try runs to its end on its
// own, and a permit won by a try the caller no longer waits for is
// released at once.
func (l *Client) acquireWaiting(ctx context.Context, a *acquire) (Acquired, error) {
	w, ok := a.waker.Wait(a.ns, a.lock, a.owner, a.limit)
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
	skip := false
	if c, ok := w.(Cached); ok {
		if free, ok := l.freeInCache(c, a); ok {
			skip = c.Sleep(free)
		}
	}
	for {
		if err := ctx.Err(); err != nil {
			return Acquired{}, err
		}
		if skip {
			skip = false
		} else {
			got, err := l.try(ctx, a)
			lost := err == nil && (got.Reason == ReasonHeld || got.Reason == ReasonContended)
			if err == nil && (got.Acquired || lost) {
				slot := -1
				if got.Acquired {
					slot = got.Slot
				}
				w.Tried(got.Acquired, slot)
			}
			if last || !lost {
				return got, err
			}
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

// freeInCache answers the slots that a could take that c shows free, when
// every other one is held by a live permit of another owner. Anything
// else (no cache, a permit of a's owner, one that expired or is being
// deleted) answers false, and the try is sent.
func (l *Client) freeInCache(c Cached, a *acquire) ([]int, bool) {
	ps, ok := c.Permits()
	if !ok {
		return nil, false
	}
	limit := max(a.limit, 1)
	now := l.clock.Now()
	held := make([]bool, limit)
	for i := range ps {
		p := &ps[i]
		switch {
		case p.Spec.Lock != a.lock:
		case AnswersAlready(p, a.owner, a.limit):
			return nil, false
		case p.Spec.Slot < 0 || int(p.Spec.Slot) >= limit:
		case !p.DeletionTimestamp.IsZero() || permit.Expired(p, now):
			return nil, false
		default:
			held[p.Spec.Slot] = true
		}
	}
	var free []int
	for slot, h := range held {
		if !h {
			free = append(free, slot)
		}
	}
	return free, true
}

// AnswersAlready tells whether an acquire of a semaphore of limit for
// owner answers already because of permit p: p is owner's, on any slot of
// a semaphore or on slot 0 of a lock (a lock's acquire reads that slot
// alone). No permit is an empty owner's.
func AnswersAlready(p *locksv1alpha1.QueenLock, owner string, limit int) bool {
	return owner != "" && p.Spec.Owner == owner && (limit > 1 || p.Spec.Slot == 0)
}

// try is one acquire that the caller's going away does not cut short.
func (l *Client) try(ctx context.Context, a *acquire) (Acquired, error) {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tryTimeout)
	defer cancel()
	got, err := l.acquireOnce(tctx, a)
	if err == nil && got.Acquired && !got.Already && ctx.Err() != nil && !a.keep {
		// Nobody waits for this answer any more: give the slot back, that
		// version alone (GiveBack).
		if _, rerr := l.GiveBack(tctx, a.ns, a.lock, got.Slot, got.Token); rerr != nil {
			return Acquired{}, fmt.Errorf("the caller went away while acquiring lock %q, and releasing the slot it won failed: %w", a.lock, rerr)
		}
		return Acquired{}, ctx.Err()
	}
	return got, err
}
