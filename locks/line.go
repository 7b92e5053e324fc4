package locks

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// Liner lets a waiting acquire wait its turn in its lock's line: the
// lock's waiters (QueenLockWaiter objects), ordered by the resourceVersion
// the API server gave each at its create. A Waker that is also a Liner
// puts every waiting acquire in the line.
type Liner interface {
	// Follow starts following the permits and the line of lock in ns;
	// false when it cannot (no room for another waiter, or nothing to
	// follow them with): the acquire then waits as a Waker's waiter.
	Follow(ns, lock string) (Follow, bool)
}

// Follow is a watch of one lock's permits and line.
type Follow interface {
	// C is signalled when a permit or a waiter of the lock changed.
	C() <-chan struct{}
	// Permits and Line answer the lock's permits and waiters as the
	// watch has them. Line's second answer is false until the watch has
	// listed the line once.
	Permits() []locksv1alpha1.QueenLock
	Line() ([]locksv1alpha1.QueenLockWaiter, bool)
	// Stop ends the watch.
	Stop()
}

// acquireInLine is a waiting acquire that takes its turn. It tries at once
// when the line is empty, as a plain acquire; when that loses, it joins the
// line (see place) and from then on tries only at its turn (see turn). A watch can be behind, never ahead: a waiter
// earlier than this one was created before it, so a watch that has seen
// this waiter has seen every earlier one, and a departure it has not seen
// yet only makes it wait for that event. The decision to try comes from
// the watch; the try itself is the usual conditional write, which a stale
// watch can only make lose.
func (l *Client) acquireInLine(ctx context.Context, a *acquire, f Follow) (Acquired, error) {
	defer f.Stop()
	deadline := time.NewTimer(a.wait)
	defer deadline.Stop()

	var p *place
	defer func() {
		if p != nil {
			p.leave()
		}
	}()
	// The first try is a plain acquire, unless the watch already shows
	// others waiting: it costs a free lock one create, as without a wait.
	if ws, _ := f.Line(); len(ws) == 0 {
		got, err := l.try(ctx, a)
		if err != nil || !lostTry(got) {
			return got, err
		}
	}
	var err error
	if p, err = l.join(ctx, a); err != nil {
		if noLine(err) {
			// A client that may not join the line waits outside it, woken
			// as before the line.
			return l.acquireWaiting(ctx, a)
		}
		return Acquired{}, err
	}
	a.queued = true
	if q, ok := f.(interface{ Queued() }); ok {
		q.Queued()
	}
	expiry := time.NewTimer(time.Hour)
	defer expiry.Stop()
	last := false
	for {
		turn, next := l.turn(f, p, a)
		if turn {
			got, err := l.try(ctx, a)
			if err != nil || !lostTry(got) {
				return got, err
			}
		}
		if last {
			return l.heldNow(ctx, a)
		}
		if !next.IsZero() {
			expiry.Reset(time.Until(next))
		}
		select {
		case <-f.C():
		case <-p.moved:
		case <-expiry.C:
		case <-deadline.C:
			last = true
		case <-ctx.Done():
			return Acquired{}, ctx.Err()
		}
	}
}

func lostTry(got Acquired) bool {
	return !got.Acquired && (got.Reason == ReasonHeld || got.Reason == ReasonContended)
}

// heldNow answers a wait that ran out: who holds the lock, read from the
// API server.
func (l *Client) heldNow(ctx context.Context, a *acquire) (Acquired, error) {
	bySlot, err := l.list(ctx, a.ns, a.lock)
	if err != nil {
		return Acquired{}, err
	}
	now := l.clock.Now()
	holders := []Holder{}
	for slot, pm := range bySlot {
		if slot >= max(a.limit, 1) || permit.Expired(pm, now) {
			continue
		}
		h, err := holderOf(pm)
		if err != nil {
			return Acquired{}, err
		}
		holders = append(holders, h)
	}
	sortHolders(holders)
	return Acquired{Reason: ReasonHeld, Holders: holders}, nil
}

// turn tells whether the waiter at p may try now, by its watch: a permit
// of its owner is there (the try answers already), or a slot it can use
// is free and no waiter ahead of it could use one. So waiters take slots
// one at a time, in their order, even when several free at once: the next
// tries when the watch shows the one before it served (a permit of its
// owner) or gone from the line. It also answers when the
// next permit it can use may be taken over, for a timer.
func (l *Client) turn(f Follow, p *place, a *acquire) (bool, time.Time) {
	ws, ok := f.Line()
	if !ok {
		return false, time.Time{}
	}
	me, seen := p.key(ws)
	if !seen {
		return false, time.Time{}
	}
	limit := max(a.limit, 1)
	held := make([]bool, limit)
	now := l.clock.Now()
	var next time.Time
	// served: owners that hold a permit of the lock. A waiter ahead whose
	// owner holds one has been served (its try won; it leaves the line
	// once its answer is out): the next may try without waiting for that
	// leave, and still tries after that win, so tokens keep the order.
	served := map[string]bool{}
	for _, pm := range f.Permits() {
		if pm.Spec.Lock == a.lock && pm.DeletionTimestamp.IsZero() && !permit.Expired(&pm, now) {
			served[pm.Spec.Owner] = true
		}
		switch {
		case pm.Spec.Lock != a.lock:
		case AnswersAlready(&pm, a.owner, a.limit) && pm.DeletionTimestamp.IsZero() && !permit.Expired(&pm, now):
			// Its own live permit: the try answers already. One that
			// expired is a slot like any other: taking it over is the
			// line's turn, not this owner's.
			return true, time.Time{}
		case pm.Spec.Slot < 0 || int(pm.Spec.Slot) >= limit:
		case !pm.DeletionTimestamp.IsZero():
			held[pm.Spec.Slot] = true // free once its delete is seen
		case !l.takeable(&pm, now):
			held[pm.Spec.Slot] = true
			if pm.Spec.ExpireTime != nil {
				at := pm.Spec.ExpireTime.Add(l.grace)
				if next.IsZero() || at.Before(next) {
					next = at
				}
			}
		}
	}
	free, lowest := 0, -1
	for slot, h := range held {
		if !h {
			free++
			if lowest < 0 {
				lowest = slot
			}
		}
	}
	if free == 0 {
		return false, next
	}
	ahead, from := 0, 0
	for i := range ws {
		w := &ws[i]
		if w.Spec.Lock != a.lock || w.Name == p.name || w.DeletionTimestamp != nil || served[w.Spec.Owner] {
			continue
		}
		if k := LineKey(w); k < me {
			// A waiter that cannot use the lowest free slot (its limit is
			// lower) is passed: the larger limit rules. Its slots stay
			// its own: the try takes none below its limit (from).
			if int(w.Spec.Limit) > lowest {
				ahead++
			}
			from = max(from, int(w.Spec.Limit))
		}
	}
	a.from = from
	return ahead == 0, next
}

// LineKey is a waiter's place in its lock's line: the resourceVersion of
// its create. Its carrier records it as spec.position at its first renew;
// until then the object's resourceVersion is still that of its create.
func LineKey(w *locksv1alpha1.QueenLockWaiter) uint64 {
	if w.Spec.Position > 0 {
		return uint64(w.Spec.Position)
	}
	k, err := permit.Token(w.ResourceVersion)
	if err != nil {
		return ^uint64(0)
	}
	return k
}

// acquireAny runs a as it asks: once, waiting in the line, or waiting to
// be woken.
func (l *Client) acquireAny(ctx context.Context, a *acquire) (Acquired, error) {
	if a.wait <= 0 || a.waker == nil {
		return l.acquireOnce(ctx, a)
	}
	if liner, ok := a.waker.(Liner); ok {
		if f, ok := liner.Follow(a.ns, a.lock); ok {
			return l.acquireInLine(ctx, a, f)
		}
	}
	return l.acquireWaiting(ctx, a)
}

// countLine adds the length of the line to a held answer, when the Client
// counts it.
func (l *Client) countLine(ctx context.Context, a *acquire, got *Acquired) error {
	if !l.countWaiting || got.Acquired || got.Reason != ReasonHeld {
		return nil
	}
	n, err := l.Waiting(ctx, a.ns, a.lock)
	if noLine(err) {
		return nil // no line to count: none waits in it
	}
	got.Waiting = n
	return err
}

// yields tells whether an acquire that is not in the line must leave a
// slot it found free or expired to the line: it does when anyone waits.
// Only an acquire whose first write lost gets here, so the read of the
// line never costs the fast path (a free slot of a lock nobody waits
// for) anything.
func (l *Client) yields(ctx context.Context, a *acquire) (bool, error) {
	if a.queued {
		return false, nil
	}
	n, err := l.Waiting(ctx, a.ns, a.lock)
	if noLine(err) {
		// A client that may not read the line (a role written before
		// the line, with rights on permits alone) cannot respect it:
		// it acquires as it did before the line.
		return false, nil
	}
	return n > 0, err
}

// Queued tells an acquire that its caller has waited its turn in the
// lock's line (the gate does, for a gated pod's waiter): it may take a
// free or expired slot while others wait behind it.
func Queued() AcquireOption { return func(c *acquireConfig) { c.queued = true } }

// noLine tells whether err says this client has no line to wait in: it
// may not read or write waiters, or the API server does not serve them
// (a cluster whose CRDs predate the line).
func noLine(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsNotFound(err) || meta.IsNoMatchError(err)
}
