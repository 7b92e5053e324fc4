// Package handle gives Go programs locks and semaphores that renew
// themselves: Acquire, Release, Run with a wait, a background renew every
// third of the lifetime, and a signal when the lock is lost.
//
//	// The pod's projected token of audience queen-locks, re-read at every call.
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
	mrand "math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/routeapi"
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

// holding is the renew loop of one acquisition.
type holding struct {
	stop chan struct{} // closed, once, to stop the loop
	done chan struct{} // closed when the loop has ended
	once sync.Once
}

func (r *holding) halt() { r.once.Do(func() { close(r.stop) }) }

// Name, Owner and Limit describe the handle.
func (h *Handle) Name() string  { return h.name }
func (h *Handle) Owner() string { return h.owner }
func (h *Handle) Limit() int    { return h.limit }

func (h *Handle) ttlSeconds() int64 { return int64(math.Ceil(h.ttl.Seconds())) }

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

func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
