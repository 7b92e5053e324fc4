package handle

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"time"
)

// RunOption adjusts Run.
type RunOption func(*runConfig)

type runConfig struct {
	wait    time.Duration
	waiting func(reason string)
}

// Wait lets Run wait up to d for the lock. Over the route it sends
// waitSeconds, and the route wakes it as soon as a slot frees; over the
// Kubernetes API it watches the lock's permits. Where neither can wait (a
// route without waitSeconds, a lifetime under 3 s), it polls every 100 ms
// to 1 s with jitter. There is no queue across processes: no order among
// waiters is promised.
func Wait(d time.Duration) RunOption { return func(c *runConfig) { c.wait = d } }

// Waiting calls fn, with the reason (held, contended), when Run's first try
// finds the lock taken and Run is going to wait for it.
func Waiting(fn func(reason string)) RunOption { return func(c *runConfig) { c.waiting = fn } }

// answerTimeout bounds how long Run waits for the answer to an acquire it
// sent, or for its release, once its context has ended.
const answerTimeout = 10 * time.Second

// Run acquires the lock (waiting as Wait allows), runs fn with a context
// that is cancelled when the lock is lost, and releases the lock after. It
// answers false, without running fn, when the lock could not be had in time
// or ctx ended first. Runs of one handle take turns.
//
// An acquire in flight when ctx ends is let finish (up to answerTimeout)
// and released if it won: abandoning it could leave a permit held that
// nobody would release before its TTL ends. Likewise an acquire whose
// answer was lost is looked up and released when Run gives up.
func (h *Handle) Run(ctx context.Context, fn func(ctx context.Context) error, opts ...RunOption) (bool, error) {
	var cfg runConfig
	for _, o := range opts {
		o(&cfg)
	}
	giveUp := time.Now().Add(cfg.wait)
	if err := h.takeTurn(ctx, giveUp); err != nil {
		return false, err
	}
	defer func() { <-h.turn }()
	poll := 100 * time.Millisecond
	told, first := false, true
	for {
		if err := ctx.Err(); err != nil {
			return false, errors.Join(err, h.cleanUp(ctx))
		}
		// A wait of its own per call, at most a third of the lifetime: the
		// handle counts the lease from when the call was sent, so a longer
		// wait would leave it too little of the lease when the answer comes.
		// The first try answers at once, so that Waiting and Reason tell
		// the caller the lock is taken before the wait begins.
		w := min(time.Until(giveUp), h.ttl/3, 60*time.Second).Truncate(time.Second)
		if first {
			w = 0
		}
		first = false
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), answerTimeout+max(w, 0))
		ok, waited, err := h.acquire(actx, w)
		cancel()
		if ok && ctx.Err() != nil {
			return false, errors.Join(ctx.Err(), h.cleanUp(ctx))
		}
		if ok {
			break
		}
		left := time.Until(giveUp)
		if left <= 0 {
			return false, errors.Join(err, h.cleanUp(ctx))
		}
		if !told && err == nil && cfg.waiting != nil {
			told = true
			cfg.waiting(h.Reason())
		}
		if waited && err == nil {
			continue // the server held the call until a slot freed or the wait ended
		}
		// Jitter spreads waiters out, so they do not all ask at once.
		d := min(poll/2+mrand.N(poll), left)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, errors.Join(ctx.Err(), h.cleanUp(ctx))
		case <-t.C:
		}
		poll = min(poll*2, time.Second)
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(h.Context(), func() { cancel(context.Cause(h.Context())) })
	err := fn(runCtx)
	stop()
	cancel(nil)
	if rerr := h.cleanUp(ctx); rerr != nil && !errors.Is(rerr, ErrLost) {
		return true, errors.Join(err, rerr)
	}
	return true, err
}

// takeTurn waits, until ctx ends or the time until, for other Runs of this
// handle to end.
func (h *Handle) takeTurn(ctx context.Context, until time.Time) error {
	select {
	case h.turn <- struct{}{}:
		return nil
	default:
	}
	t := time.NewTimer(time.Until(until))
	defer t.Stop()
	select {
	case h.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("queen-locks: %q: another Run of this handle still runs", h.name)
	}
}

// cleanUp releases, even once ctx has ended, whatever the handle holds or
// may hold.
func (h *Handle) cleanUp(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), answerTimeout)
	defer cancel()
	return h.Release(rctx)
}
