// Package handle gives Go programs locks and semaphores that renew
// themselves: Acquire, Release, Run with a wait, a background renew every
// third of the lifetime, and a signal when the lock is lost.
//
//	// The pod's projected token of audience queen-locks, read again when it changes.
//	c := handle.New(handle.HTTP(url, handle.HTTPOptions{CAFile: "/etc/queen-locks/ca.crt"}))
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
	"os"
	"sync"
	"time"

	"github.com/queen-locks/queen-locks/locks"
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

// ServiceAccountTokenFile is where a pod finds its ServiceAccount token of
// the API server's audience, which the route refuses unless its operator
// added that audience: mount a projected token at ProjectedTokenFile instead.
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
	h := &Handle{t: c.t, name: name, limit: n, ttl: ttl, owner: MintOwner(), turn: make(chan struct{}, 1)}
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
// are safe for concurrent use: Acquire and Release take turns, Runs of one
// handle take turns, and the getters never wait for the server.
type Handle struct {
	t     Transport
	name  string
	limit int
	ttl   time.Duration
	owner string

	// ops makes Acquire and Release take turns. It is held across their
	// calls to the server, so two Releases never both stop the renew loop
	// or both send a release, and a Release that comes while an Acquire is
	// in flight releases what that Acquire got.
	ops sync.Mutex
	// turn is held by a Run for as long as it runs, so one handle never
	// runs two fns under one permit at once.
	turn chan struct{}

	mu       sync.Mutex // guards what follows; never held across a call to the server
	held     bool
	unsure   bool // an acquire or release was not answered: the server may hold a permit of ours
	slot     int
	token    uint64
	deadline time.Time // local monotonic reading: when we must assume the lease is over
	reason   string    // why the last acquire failed, or why the lock was lost
	holders  []locks.Holder
	ctx      context.Context
	cancel   context.CancelCauseFunc
	lost     chan struct{}
	cur      *holding      // the renew loop of the current (or last) holding
	renewing chan struct{} // while a renew is in flight: closed when it has answered
	renewSeq uint64        // renews sent so far
	onLost   []func(reason string)
	onRenew  []func(token uint64)
}

// Name, Owner and Limit describe the handle.
func (h *Handle) Name() string  { return h.name }
func (h *Handle) Owner() string { return h.owner }
func (h *Handle) Limit() int    { return h.limit }

func (h *Handle) ttlSeconds() int64 { return int64(math.Ceil(h.ttl.Seconds())) }

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

// OnLost calls fn, with the reason, whenever a held lock is lost. fn may
// call the handle's methods, Acquire included.
func (h *Handle) OnLost(fn func(reason string)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.onLost = append(h.onLost, fn)
}

// OnRenew calls fn with the new token after each successful renew. fn runs
// on the goroutine that renews, before the next renew: it must return
// promptly and must not call Release, which waits for that goroutine.
func (h *Handle) OnRenew(fn func(token uint64)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.onRenew = append(h.onRenew, fn)
}
