package handle

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// holding is the renew loop of one acquisition.
type holding struct {
	stop chan struct{} // closed, once, to stop the loop
	done chan struct{} // closed when the loop has ended
	once sync.Once
}

func (r *holding) halt() { r.once.Do(func() { close(r.stop) }) }

// start records a won permit, with its deadline counted from sent, and
// starts renewing it.
func (h *Handle) start(slot int, token uint64, sent time.Time) {
	r := &holding{stop: make(chan struct{}), done: make(chan struct{})}
	h.mu.Lock()
	h.held, h.unsure, h.slot, h.token, h.reason, h.holders = true, false, slot, token, "", nil
	h.deadline = sent.Add(h.ttl)
	h.ctx, h.cancel = context.WithCancelCause(context.Background())
	if h.lost == nil || closed(h.lost) {
		h.lost = make(chan struct{})
	}
	h.cur = r
	h.mu.Unlock()
	go h.renewLoop(r)
}

// renewLoop renews every third of the lifetime until stopped or lost.
func (h *Handle) renewLoop(r *holding) {
	// On a loss the OnLost callbacks run once the loop has ended, so that
	// one may call Acquire, which waits for this loop to end.
	var lost func()
	defer func() {
		close(r.done)
		if lost != nil {
			lost()
		}
	}()
	interval := h.ttl / 3
	retry := max(h.ttl/10, 100*time.Millisecond)
	next := time.NewTimer(interval)
	defer next.Stop()
	for {
		h.mu.Lock()
		deadline, slot, token := h.deadline, h.slot, h.token
		h.mu.Unlock()
		expiry := time.NewTimer(time.Until(deadline))
		select {
		case <-r.stop:
			expiry.Stop()
			return
		case <-expiry.C:
			lost = h.lose(r, 0, LostExpired)
			return
		case <-next.C:
			expiry.Stop()
		}
		inflight := make(chan struct{})
		h.mu.Lock()
		h.renewing = inflight
		h.renewSeq++
		h.mu.Unlock()
		sent := time.Now()
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		rn, err := h.t.Renew(ctx, h.name, slot, token, h.owner, h.ttlSeconds())
		cancel()
		stopped := false
		select {
		case <-r.stop:
			// Release is waiting for us: record a token that landed, so it
			// releases the current one.
			stopped = true
			if err == nil && rn.Renewed {
				h.renewed(r, rn.Token, sent)
			}
		default:
			switch {
			case err != nil:
				// The server did not answer: keep trying until the deadline.
				next.Reset(retry)
			case !rn.Renewed:
				lost = h.lose(r, 0, LostRenew)
				stopped = true
			default:
				h.renewed(r, rn.Token, sent)
				next.Reset(interval)
			}
		}
		h.mu.Lock()
		h.renewing = nil
		h.mu.Unlock()
		close(inflight)
		if stopped {
			return
		}
	}
}

// renewed records the token of a renew sent at sent, if r still holds.
func (h *Handle) renewed(r *holding, token uint64, sent time.Time) {
	h.mu.Lock()
	if !h.held || h.cur != r {
		h.mu.Unlock()
		return
	}
	h.token, h.deadline = token, sent.Add(h.ttl)
	fns := append([]func(uint64){}, h.onRenew...)
	h.mu.Unlock()
	for _, fn := range fns {
		fn(token)
	}
}

// lose marks the holding r lost, once, and stops its renewing. With a token
// other than 0 it does so only while that token is still the handle's: a
// renew may have moved on since the caller read it. It answers the call
// that tells the OnLost callbacks, for the caller to make outside any lock.
func (h *Handle) lose(r *holding, token uint64, reason string) (tell func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.held || h.cur != r || (token != 0 && h.token != token) {
		return func() {}
	}
	h.held, h.reason = false, reason
	close(h.lost)
	h.cancel(fmt.Errorf("%w: %s", ErrLost, reason))
	r.halt()
	fns := append([]func(string){}, h.onLost...)
	return func() {
		for _, fn := range fns {
			fn(reason)
		}
	}
}

func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
