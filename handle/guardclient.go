package handle

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/guard"
)

// Client wraps c so that its writes of guarded objects carry this handle's
// guard, with the token of the moment each is sent (package guard). A write
// refused because the lock was taken over makes the handle lose the lock
// with reason guard, and the client then refuses every later write unsent.
//
// The client writes under one holding: the one the handle has when the
// client first writes. Once that holding ends (released or lost) the client
// refuses every write unsent; make a new one after acquiring again.
func (h *Handle) Client(c client.Client, opts ...guard.Option) *guard.Client {
	return guard.NewClient(c, &guardSource{h: h}, opts...)
}

// guardSource is a handle's holding as what a guarded client writes under.
type guardSource struct {
	h *Handle
	r *holding // the holding, once the client first wrote; under h.mu
}

func (s *guardSource) Current() (guard.Fence, bool) {
	h := s.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.r == nil && h.held {
		s.r = h.cur
	}
	held := h.held && h.cur == s.r
	return guard.Fence{Namespace: h.t.Namespace(), Lock: h.name, Slot: h.slot, Token: h.token}, held
}

// Refresh answers the token this holding has now, after a write under
// refused was refused. A renew in flight may have moved the permit before
// the handle recorded it: its answer is awaited. A renew whose answer never
// came may have moved it too: the permit itself is read, and a newer token
// of this handle's owner is this holding's (two handles of one owner are
// one holder, and a holding of ours that ended would have ended this one).
func (s *guardSource) Refresh(ctx context.Context, refused guard.Fence) (guard.Fence, bool, error) {
	h := s.h
	for {
		f, held := s.Current()
		if !held || f.Token != refused.Token {
			return f, held, nil
		}
		h.mu.Lock()
		inflight := h.renewing
		h.mu.Unlock()
		if inflight == nil {
			break
		}
		select {
		case <-inflight:
		case <-ctx.Done():
			return guard.Fence{}, false, ctx.Err()
		}
	}
	holders, err := h.t.Get(ctx, h.name)
	if err != nil {
		return guard.Fence{}, false, err
	}
	for _, hd := range holders {
		if hd.Slot == refused.Slot && hd.Owner == h.owner && hd.Token >= refused.Token {
			f := refused
			f.Token = hd.Token
			return f, true, nil
		}
	}
	return guard.Fence{}, false, nil
}

// Lose ends the client's holding with reason, unless it ended already.
func (s *guardSource) Lose(reason string) {
	h := s.h
	h.mu.Lock()
	r := s.r
	h.mu.Unlock()
	if r != nil {
		h.lose(r, 0, reason)()
	}
}
