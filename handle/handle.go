// Package handle gives Go programs locks and semaphores that renew
// themselves: Acquire, Release, Run with a wait, a background renew every
// third of the lifetime, and a signal when the lock is lost.
//
//	c := handle.New(handle.HTTP(url, handle.HTTPOptions{TokenFile: handle.ServiceAccountTokenFile}))
//	lock := c.Lock("daily-report", 30*time.Second)
//	acquired, err := lock.Run(ctx, func(ctx context.Context) error {
//		return report(ctx) // ctx ends when the lock is lost
//	}, handle.Wait(10*time.Second))
package handle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/wire"
)

// Why a handle lost its lock, as OnLost reports it.
const (
	// LostRenew: the server answered that the permit is no longer ours.
	LostRenew = "renew"
	// LostGuard: a check of the handle's token failed.
	LostGuard = "guard"
	// LostExpired: the lifetime passed on this machine's clock, counted from
	// when the last successful renew was sent, without a renew getting through.
	LostExpired = "expired"
)

// ServiceAccountTokenFile is where a pod finds its ServiceAccount token.
const ServiceAccountTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"

// ErrLost is the cause of a handle's context once its lock is lost.
var ErrLost = errors.New("queen-locks: the lock was lost")

// ErrReleased is the cause of a handle's context after Release.
var ErrReleased = errors.New("queen-locks: the lock was released")

// Client makes handles over one transport.
type Client struct {
	t Transport
}

// New returns a Client over t.
func New(t Transport) *Client { return &Client{t: t} }

// Option adjusts a handle.
type Option func(*Handle)

// WithOwner sets the handle's owner instead of a minted one. Two handles
// with the same owner are one holder.
func WithOwner(owner string) Option { return func(h *Handle) { h.owner = owner } }

// Lock is a handle on the lock name: one holder at a time, for ttl, renewed
// in the background while held.
func (c *Client) Lock(name string, ttl time.Duration, opts ...Option) *Handle {
	return c.Semaphore(name, 1, ttl, opts...)
}

// Semaphore is a handle on one of n permits of name.
func (c *Client) Semaphore(name string, n int, ttl time.Duration, opts ...Option) *Handle {
	h := &Handle{t: c.t, name: name, limit: n, ttl: ttl, owner: MintOwner()}
	for _, o := range opts {
		o(h)
	}
	return h
}

// MintOwner makes an owner unique to this process and call: host:pid:random.
func MintOwner() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b))
}

// Handle is one holder's view of a lock or a semaphore permit. Its methods
// are safe for concurrent use.
type Handle struct {
	t     Transport
	name  string
	limit int
	ttl   time.Duration
	owner string

	mu       sync.Mutex
	held     bool
	slot     int
	token    uint64
	deadline time.Time // local: when we must assume the lease is over
	reason   string    // why the last acquire failed, or why the lock was lost
	holders  []locks.Holder
	ctx      context.Context
	cancel   context.CancelCauseFunc
	lost     chan struct{}
	stop     chan struct{} // closed to stop the renew loop
	done     chan struct{} // closed when the renew loop has ended
	onLost   []func(reason string)
	onRenew  []func(token uint64)
}

// Name, Owner and Limit describe the handle.
func (h *Handle) Name() string  { return h.name }
func (h *Handle) Owner() string { return h.owner }
func (h *Handle) Limit() int    { return h.limit }

func (h *Handle) ttlSeconds() int64 { return int64(math.Ceil(h.ttl.Seconds())) }

// Acquire tries once to take the lock. It answers false with no error when
// somebody else holds it (Reason and Holders say more). After an error the
// same handle can simply try again: it keeps its owner, so an acquire whose
// answer was lost comes back as already held by us.
func (h *Handle) Acquire(ctx context.Context) (bool, error) {
	if err := permit.ValidateTTL(h.ttlSeconds()); err != nil || h.ttl < time.Second {
		return false, fmt.Errorf("queen-locks: ttl %v: must be from 1s to %ds", h.ttl, permit.MaxTTLSeconds)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held {
		return true, nil
	}
	sent := time.Now()
	a, err := h.t.Acquire(ctx, h.name, h.owner, h.ttlSeconds(), h.limit)
	if err != nil {
		return false, err
	}
	if !a.Acquired {
		h.reason, h.holders = a.Reason, a.Holders
		return false, nil
	}
	h.held, h.slot, h.token, h.reason, h.holders = true, a.Slot, a.Token, "", nil
	h.deadline = sent.Add(h.ttl)
	if a.Already {
		// We held it before this call; the server's expiry bounds our deadline.
		h.deadline = minTime(h.deadline, a.ExpiresAt)
	}
	h.ctx, h.cancel = context.WithCancelCause(context.Background())
	if h.lost == nil || closed(h.lost) {
		h.lost = make(chan struct{})
	}
	h.stop, h.done = make(chan struct{}), make(chan struct{})
	go h.renewLoop(h.stop, h.done)
	return true, nil
}

// renewLoop renews every third of the lifetime until stopped or lost.
func (h *Handle) renewLoop(stop, done chan struct{}) {
	defer close(done)
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
		case <-stop:
			expiry.Stop()
			return
		case <-expiry.C:
			h.lose(LostExpired)
			return
		case <-next.C:
			expiry.Stop()
		}
		sent := time.Now()
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		rn, err := h.t.Renew(ctx, h.name, slot, token, h.owner, h.ttlSeconds())
		cancel()
		select {
		case <-stop:
			if err == nil && rn.Renewed {
				h.setToken(rn.Token, sent)
			}
			return
		default:
		}
		switch {
		case err != nil:
			// The server did not answer: keep trying until the deadline.
			next.Reset(retry)
		case !rn.Renewed:
			h.lose(LostRenew)
			return
		default:
			h.setToken(rn.Token, sent)
			next.Reset(interval)
		}
	}
}

func (h *Handle) setToken(token uint64, sent time.Time) {
	h.mu.Lock()
	h.token, h.deadline = token, sent.Add(h.ttl)
	fns := append([]func(uint64){}, h.onRenew...)
	h.mu.Unlock()
	for _, fn := range fns {
		fn(token)
	}
}

// lose marks the lock lost, once, and tells whoever listens.
func (h *Handle) lose(reason string) {
	h.mu.Lock()
	if !h.held {
		h.mu.Unlock()
		return
	}
	h.held, h.reason = false, reason
	close(h.lost)
	h.cancel(fmt.Errorf("%w: %s", ErrLost, reason))
	fns := append([]func(string){}, h.onLost...)
	h.mu.Unlock()
	for _, fn := range fns {
		fn(reason)
	}
}

// Release stops renewing and releases the permit. It is a no-op when the
// handle holds nothing. It answers ErrLost when the server says the permit
// was no longer ours.
func (h *Handle) Release(ctx context.Context) error {
	h.mu.Lock()
	if !h.held {
		h.mu.Unlock()
		return nil
	}
	stop, done := h.stop, h.done
	h.mu.Unlock()
	close(stop)
	<-done // an in-flight renew has landed or failed; its token is recorded
	h.mu.Lock()
	if !h.held { // lost while we waited
		h.mu.Unlock()
		return nil
	}
	h.held = false
	slot, token := h.slot, h.token
	h.cancel(ErrReleased)
	h.mu.Unlock()
	ok, err := h.t.Release(ctx, h.name, slot, token, h.owner)
	if err != nil {
		return fmt.Errorf("queen-locks: releasing %q: %w", h.name, err)
	}
	if !ok {
		return ErrLost
	}
	return nil
}

// Held tells whether the handle holds the lock now, as far as it knows.
func (h *Handle) Held() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.held }

// Token is the current fencing token. Read it when you use it: every renew
// changes it.
func (h *Handle) Token() uint64 { h.mu.Lock(); defer h.mu.Unlock(); return h.token }

// Slot is the permit's slot: always 0 for a lock.
func (h *Handle) Slot() int { h.mu.Lock(); defer h.mu.Unlock(); return h.slot }

// Reason says why the last Acquire failed (held, contended) or why the lock
// was lost (renew, guard, expired).
func (h *Handle) Reason() string { h.mu.Lock(); defer h.mu.Unlock(); return h.reason }

// Holders lists who held the lock when the last Acquire answered held.
func (h *Handle) Holders() []locks.Holder {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]locks.Holder(nil), h.holders...)
}

// Context is cancelled when the lock is lost or released; its cause says
// which. Before the first successful Acquire it is already cancelled.
func (h *Handle) Context() context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ctx == nil {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(errors.New("queen-locks: not acquired"))
		return ctx
	}
	return h.ctx
}

// Lost is closed when the held lock is lost (not when it is released).
func (h *Handle) Lost() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost == nil {
		h.lost = make(chan struct{})
	}
	return h.lost
}

// OnLost calls fn, with the reason, whenever a held lock is lost.
func (h *Handle) OnLost(fn func(reason string)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.onLost = append(h.onLost, fn)
}

// OnRenew calls fn with the new token after each successful renew.
func (h *Handle) OnRenew(fn func(token uint64)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.onRenew = append(h.onRenew, fn)
}

// Guard is the check that fences a write with the current token.
func (h *Handle) Guard() wire.Guard {
	h.mu.Lock()
	defer h.mu.Unlock()
	return wire.Guard{Op: "check", NS: wire.GuardNamespace, Namespace: h.t.Namespace(),
		Key: wire.GuardKey(h.name, h.slot), Expect: h.token, Required: true}
}

// Check asks the server whether the handle's token is still the permit's.
// When it is not, the handle counts the lock as lost with reason guard.
func (h *Handle) Check(ctx context.Context) (bool, error) {
	h.mu.Lock()
	held, slot, token := h.held, h.slot, h.token
	h.mu.Unlock()
	if !held {
		return false, nil
	}
	ok, err := h.t.Check(ctx, h.name, slot, token)
	if err != nil {
		return false, err
	}
	if !ok {
		// A renew may have landed between our read of the token and the
		// check; only a check of the token we hold now counts.
		if h.Token() == token {
			h.lose(LostGuard)
		}
	}
	return ok, nil
}

// RunOption adjusts Run.
type RunOption func(*runConfig)

type runConfig struct{ wait time.Duration }

// Wait lets Run wait up to d for the lock, polling every 100 ms to 1 s with
// jitter. There is no queue: whoever asks first after a release wins.
func Wait(d time.Duration) RunOption { return func(c *runConfig) { c.wait = d } }

// Run acquires the lock (waiting as Wait allows), runs fn with a context
// that is cancelled when the lock is lost, and releases the lock after. It
// answers false, without running fn, when the lock could not be had in time.
func (h *Handle) Run(ctx context.Context, fn func(ctx context.Context) error, opts ...RunOption) (bool, error) {
	var cfg runConfig
	for _, o := range opts {
		o(&cfg)
	}
	giveUp := time.Now().Add(cfg.wait)
	poll := 100 * time.Millisecond
	for {
		ok, err := h.Acquire(ctx)
		if ok {
			break
		}
		left := time.Until(giveUp)
		if left <= 0 {
			return false, err
		}
		// Jitter spreads waiters out, so they do not all ask at once.
		d := min(poll/2+mrand.N(poll), left)
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(d):
		}
		poll = min(poll*2, time.Second)
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(h.Context(), func() { cancel(context.Cause(h.Context())) })
	err := fn(runCtx)
	stop()
	cancel(nil)
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer rcancel()
	if rerr := h.Release(rctx); rerr != nil && !errors.Is(rerr, ErrLost) {
		return true, errors.Join(err, rerr)
	}
	return true, err
}

func minTime(a, b time.Time) time.Time {
	if b.IsZero() || a.Before(b) {
		return a
	}
	return b
}

func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
