package handle

import (
	"context"
	"fmt"
	"time"

	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// alreadyTries bounds how often Acquire asks again when a permit the server
// says is already ours is lost before Acquire could renew it.
const alreadyTries = 3

// Acquire tries once to take the lock. It answers false with no error when
// somebody else holds it (Reason and Holders say more). After an error the
// same handle can simply try again: it keeps its owner, so an acquire whose
// answer was lost comes back as already held by us; or call Release, which
// then releases whatever that lost acquire may have taken.
func (h *Handle) Acquire(ctx context.Context) (bool, error) {
	ok, _, err := h.acquire(ctx, 0)
	return ok, err
}

// acquire is Acquire, waiting up to wait for a slot when the transport can
// be woken (the route's waitSeconds, or a watch); waited says it could.
func (h *Handle) acquire(ctx context.Context, wait time.Duration) (got, waited bool, err error) {
	ok, err := h.acquireOnce(ctx, wait, &waited)
	return ok, waited, err
}

func (h *Handle) acquireOnce(ctx context.Context, wait time.Duration, waited *bool) (bool, error) {
	if err := permit.ValidateTTL(h.ttlSeconds()); err != nil || h.ttl < time.Second {
		return false, fmt.Errorf("queen-locks: ttl %v: must be from 1s to %ds", h.ttl, permit.MaxTTLSeconds)
	}
	h.ops.Lock()
	defer h.ops.Unlock()
	h.mu.Lock()
	held, prev := h.held, h.cur
	h.mu.Unlock()
	if held {
		return true, nil
	}
	if prev != nil {
		// A loop stopped by a loss may still have a renew in flight; at
		// most one loop renews for a handle.
		select {
		case <-prev.done:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	for try := 1; ; try++ {
		sent := time.Now()
		var a locks.Acquired
		var err error
		if wt, ok := h.t.(WaitingTransport); ok && wait > 0 && try == 1 {
			a, *waited, err = wt.AcquireWaiting(ctx, h.name, h.owner, h.ttlSeconds(), h.limit, wait)
		}
		if !*waited || try > 1 {
			a, err = h.t.Acquire(ctx, h.name, h.owner, h.ttlSeconds(), h.limit)
		}
		if err != nil {
			h.setUnsure()
			return false, err
		}
		if !a.Acquired {
			// The server answers already, not held, to an owner that holds
			// a permit: this one holds none.
			h.mu.Lock()
			h.reason, h.holders, h.unsure = a.Reason, a.Holders, false
			h.mu.Unlock()
			return false, nil
		}
		if !a.Already {
			h.start(a.Slot, a.Token, sent)
			return true, nil
		}
		// The permit was already ours: an earlier acquire whose answer was
		// lost, a release that did not get through, or another handle with
		// the same owner. Its lifetime was counted from a write this handle
		// may never have seen, and the answer's expiresAt is a reading of
		// the server's wall clock, which cannot be compared with ours: a
		// clock behind the server's would make the lease look longer than
		// it is. So renew it at once and count the deadline from when that
		// renew was sent, on this machine's monotonic clock. The server
		// counts the same lifetime from when it admitted the renew, which is
		// later, so the handle still gives up first whatever the skew.
		sent = time.Now()
		rn, err := h.t.Renew(ctx, h.name, a.Slot, a.Token, h.owner, h.ttlSeconds())
		if err != nil {
			h.setUnsure()
			return false, fmt.Errorf("queen-locks: renewing %q, which the server says is already ours: %w", h.name, err)
		}
		if rn.Renewed {
			h.start(a.Slot, rn.Token, sent)
			return true, nil
		}
		// It expired or was released by hand between the two answers:
		// it is not ours any more, so ask again.
		if try == alreadyTries {
			return false, fmt.Errorf("queen-locks: acquiring %q: a permit the server said was ours was lost %d times before it could be renewed", h.name, try)
		}
	}
}

func (h *Handle) setUnsure() {
	h.mu.Lock()
	h.unsure = true
	h.mu.Unlock()
}
