package handle

import (
	"context"
	"fmt"
)

// Release stops renewing and releases the permit. It is a no-op when the
// handle holds nothing, and when several goroutines release at once only
// one release is sent. After an Acquire or a Release whose answer was lost
// it looks the permit up by owner and releases it, so nothing is left held.
// It answers ErrLost when the server says the permit was no longer ours.
func (h *Handle) Release(ctx context.Context) error {
	h.ops.Lock()
	defer h.ops.Unlock()
	h.mu.Lock()
	held, unsure, r := h.held, h.unsure, h.cur
	h.mu.Unlock()
	if !held {
		if unsure {
			return h.releaseUnsure(ctx)
		}
		return nil
	}
	r.halt()
	<-r.done // an in-flight renew has landed or failed; its token is recorded
	h.mu.Lock()
	if !h.held || h.cur != r { // lost while we waited
		h.mu.Unlock()
		return nil
	}
	h.held = false
	slot, token := h.slot, h.token
	h.cancel(ErrReleased)
	h.mu.Unlock()
	ok, err := h.t.Release(ctx, h.name, slot, token, h.owner)
	if err != nil {
		h.setUnsure()
		return fmt.Errorf("queen-locks: releasing %q: %w", h.name, err)
	}
	if !ok {
		return ErrLost
	}
	return nil
}

// releaseUnsure releases the permits of this owner that an unanswered call
// may have left. It reads the holders from the server, since the handle
// never learnt the permit's slot and token.
func (h *Handle) releaseUnsure(ctx context.Context) error {
	hs, err := h.t.Get(ctx, h.name)
	if err != nil {
		return fmt.Errorf("queen-locks: looking up %q to release what an unanswered call may have taken: %w", h.name, err)
	}
	for _, hd := range hs {
		if hd.Owner != h.owner {
			continue
		}
		// Not ours any more (lost) is as good as released here.
		if _, err := h.t.Release(ctx, h.name, hd.Slot, hd.Token, h.owner); err != nil {
			return fmt.Errorf("queen-locks: releasing %q: %w", h.name, err)
		}
	}
	h.mu.Lock()
	h.unsure = false
	h.mu.Unlock()
	return nil
}
