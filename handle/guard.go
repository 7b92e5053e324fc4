package handle

import (
	"context"

	"github.com/queen-locks/queen-locks/routeapi"
)

// Guard is the check that fences a write with the current token.
func (h *Handle) Guard() routeapi.Guard {
	h.mu.Lock()
	defer h.mu.Unlock()
	return routeapi.Guard{Op: "check", NS: routeapi.GuardNamespace, Namespace: h.t.Namespace(),
		Key: routeapi.GuardKey(h.name, h.slot), Expect: h.token, Required: true}
}

// Check asks the server whether the handle's token is still the permit's.
// When it is not, the handle counts the lock as lost with reason guard.
func (h *Handle) Check(ctx context.Context) (bool, error) {
	for {
		h.mu.Lock()
		held, slot, token, r, seq, inflight := h.held, h.slot, h.token, h.cur, h.renewSeq, h.renewing
		h.mu.Unlock()
		if !held {
			return false, nil
		}
		ok, err := h.t.Check(ctx, h.name, slot, token)
		if err != nil || ok {
			return ok, err
		}
		// Only a check of the token this holding still has counts. A renew
		// that overlapped the check may have moved the permit to a new
		// token before the handle recorded it: wait for its answer and
		// check the token it leaves.
		h.mu.Lock()
		same := h.held && h.cur == r
		overlapped := inflight != nil || h.renewSeq != seq || h.token != token
		inflight = h.renewing
		h.mu.Unlock()
		if !same {
			return false, nil // released or lost meanwhile
		}
		if !overlapped {
			h.lose(r, token, LostGuard)()
			return false, nil
		}
		if inflight != nil {
			select {
			case <-inflight:
			case <-ctx.Done():
				return false, ctx.Err()
			}
		}
	}
}
