package route

import (
	"fmt"
	"sync"
	"time"

	"github.com/queen-locks/queen-locks/internal/sources"
	"golang.org/x/sync/semaphore"
)

// Limits bound what callers can make the route hold, so that no caller,
// slow or fast, can exhaust the manager, which also serves the webhooks
// every lock write and guarded write waits for.
type Limits struct {
	// ReadHeaderTimeout bounds reading a request's headers.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, headers and body.
	ReadTimeout time.Duration
	// WriteTimeout bounds a call from the end of its headers to the end of
	// its answer. It must exceed the longest wait plus OpTimeout.
	WriteTimeout time.Duration
	// IdleTimeout bounds how long a kept-alive connection waits for its next
	// request.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers.
	MaxHeaderBytes int
	// MaxConnections bounds open connections; more wait to be accepted.
	MaxConnections int
	// MaxConnectionsPerSource bounds the open connections from one
	// address; more are closed at once. Without it one caller could hold
	// every connection MaxConnections allows, idle, and lock everybody out.
	MaxConnectionsPerSource int
	// MaxCalls bounds calls in progress; more are answered 429.
	MaxCalls int
	// MaxCallsPerCaller bounds one caller's calls in progress, so one
	// caller cannot take every slot of MaxCalls; more are answered 429.
	MaxCallsPerCaller int
	// MaxCallsPerSource bounds the calls in progress from one address,
	// counted before the caller is known: a flood of calls with bad
	// tokens from one place takes at most this many slots and costs at
	// most this many TokenReviews at once; more are answered 429.
	MaxCallsPerSource int
	// MaxBodyMemory bounds the bytes of request bodies held at once (each
	// counts its Content-Length, or MaxBody when it sends none); a call
	// whose body does not fit is answered 429.
	MaxBodyMemory int64
}

// DefaultLimits are the route's limits unless configured otherwise: about
// 64 MiB of bodies (a few times that while they are decoded) at worst, well
// under the chart's memory limit.
func DefaultLimits() Limits {
	return Limits{
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      MaxWait + 30*time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
		MaxConnections:    1024,
		// A sixteenth of the connections and an eighth of the calls from
		// one address: in a cluster every pod has its own, and a node's
		// pods share one only where the network rewrites sources.
		MaxConnectionsPerSource: 64,
		MaxCalls:                512,
		MaxCallsPerSource:       64,
		// A quarter of the body memory at most for one caller, so that one
		// caller holding its calls' bodies open cannot fill it for all.
		MaxCallsPerCaller: 16,
		MaxBodyMemory:     64 << 20,
	}
}

// LargeBody is the size from which bodies are decoded one at a time. A
// call of 64 operations with plain names and owners of the longest stays
// under it; a larger call waits its turn, it is not refused.
const LargeBody = 64 << 10

// MaxWait is the longest an acquire may wait for a slot (waitSeconds).
const MaxWait = 60 * time.Second

// RetryAfter is what a 429 tells the caller to wait, in seconds.
const RetryAfter = 1

// check refuses limits that cannot work, naming the flag.
func (l Limits) check(opTimeout time.Duration) error {
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--route-read-header-timeout", l.ReadHeaderTimeout}, {"--route-read-timeout", l.ReadTimeout}, {"--route-idle-timeout", l.IdleTimeout}} {
		if d.v <= 0 {
			return fmt.Errorf("%s is %s: it must be above 0", d.flag, d.v)
		}
	}
	if min := MaxWait + opTimeout; l.WriteTimeout <= min {
		return fmt.Errorf("--route-write-timeout is %s: it must exceed the longest wait (%s) plus the operation timeout (%s), or waiting calls would be cut off", l.WriteTimeout, MaxWait, opTimeout)
	}
	for _, n := range []struct {
		flag string
		v    int64
	}{{"--route-max-header-bytes", int64(l.MaxHeaderBytes)}, {"--route-max-connections", int64(l.MaxConnections)},
		{"--route-max-connections-per-source", int64(l.MaxConnectionsPerSource)},
		{"--route-max-calls", int64(l.MaxCalls)}, {"--route-max-calls-per-caller", int64(l.MaxCallsPerCaller)},
		{"--route-max-calls-per-source", int64(l.MaxCallsPerSource)}} {
		if n.v < 1 {
			return fmt.Errorf("%s is %d: it must be at least 1", n.flag, n.v)
		}
	}
	if l.MaxBodyMemory < MaxBody {
		return fmt.Errorf("--route-max-body-memory is %d bytes: it must hold at least one largest body (%d bytes)", l.MaxBodyMemory, MaxBody)
	}
	return nil
}

// admission counts calls in progress, in all and per caller, and the bytes
// of bodies held. Callers are counted only while they have calls in
// progress, so the map stays as small as the calls.
type admission struct {
	max, perCaller, perSource int
	bodies                    *semaphore.Weighted
	// decoding lets one large body be decoded at a time: decoding is the
	// CPU a flood of large bodies costs, and the webhooks in this process
	// must keep the rest.
	decoding *semaphore.Weighted

	// unproven and unprovenLarge hold the bodies of callers not yet known
	// to have any right (see holdBody), apart from bodies.
	unproven, unprovenLarge *semaphore.Weighted
	unprovenBodies          sources.Tally
	unprovenLargeBodies     sources.Tally
	proven                  provenCallers
	// The bytes of bodies above SmallBody held per caller, per namespace
	// of callers and per source, so that a few callers, even proven ones,
	// hold a share of bodies and not all of them.
	perCallerBytes, perNamespaceBytes, perSourceBytes sources.Tally
	perCallerMost, perNamespaceMost, perSourceMost    int64

	mu      sync.Mutex
	calls   int
	callers sources.Tally
	sources sources.Tally
	// waiting counts each caller's waiting acquires, operations not calls:
	// one call carries up to 64 of them, so MaxCallsPerCaller calls alone
	// would let one caller take every place the replica's waiters have.
	waiting sources.Tally
}

func newAdmission(l Limits) *admission {
	return &admission{max: l.MaxCalls, perCaller: l.MaxCallsPerCaller, perSource: l.MaxCallsPerSource, bodies: semaphore.NewWeighted(l.MaxBodyMemory),
		unproven: semaphore.NewWeighted(max(l.MaxBodyMemory/4, MaxBody)), unprovenLarge: semaphore.NewWeighted(max(l.MaxBodyMemory/4, MaxBody)),
		decoding:      semaphore.NewWeighted(1),
		perCallerMost: max(l.MaxBodyMemory/16, MaxBody), perNamespaceMost: max(l.MaxBodyMemory/8, MaxBody), perSourceMost: max(l.MaxBodyMemory/8, MaxBody)}
}

// enter admits one call, or answers false when MaxCalls are in progress.
func (a *admission) enter() (leave func(), ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.calls >= a.max {
		return nil, false
	}
	a.calls++
	callsInFlight.Inc()
	return sync.OnceFunc(func() {
		a.mu.Lock()
		a.calls--
		a.mu.Unlock()
		callsInFlight.Dec()
	}), true
}

// enterCaller admits one call of a caller, or answers false when that
// caller has MaxCallsPerCaller in progress.
func (a *admission) enterCaller(name string) (leave func(), ok bool) {
	return a.callers.Enter(name, a.perCaller)
}

// enterWaiting admits one waiting acquire of a caller, or answers false
// when that caller has as many waiting as it may have calls in progress:
// the acquire then answers at once, as when the replica's waiters are full.
func (a *admission) enterWaiting(name string) (leave func(), ok bool) {
	return a.waiting.Enter(name, a.perCaller)
}

// enterSource admits one call from an address, or answers false when that
// address has MaxCallsPerSource in progress.
func (a *admission) enterSource(addr string) (leave func(), ok bool) {
	return a.sources.Enter(addr, a.perSource)
}

// holdBody reserves memory for a body of n bytes for caller (of
// ServiceAccount namespace ns, "" for other users) from source, or answers
// false when it does not fit now.
//
// A body of at most SmallBody (a renew, a release, a get: what a holder
// needs to keep its lock) is never refused for memory: MaxCalls bound how
// many are held, so they can take at most MaxCalls*SmallBody, and no
// caller holding larger bodies can turn a holder's renew away.
//
// A larger body is held before the call can be authorized (the namespace
// and the operations are in it), so a caller with a valid token and no
// rights at all would otherwise hold memory as any holder does: a few such
// identities, each sending Content-Lengths they never send, could hold
// every byte. Callers whose rights this replica has seen (an authorized
// call in the last provenFor) draw from the whole budget, at most a
// sixteenth of it per caller and an eighth per namespace and per source:
// a caller proven in its own namespace, or four of them in four, hold at
// most a quarter. Every other authenticated caller draws apart: a body of
// up to LargeBody (any lock call of 64 plain operations) from a quarter of
// the budget, at most unprovenPerCaller at once per caller, so that
// filling it takes hundreds of identities; a larger body from another
// quarter, one at a time per caller. Callers without rights then take
// memory only from each other, and a new caller's ordinary first call, or
// a caller that last called the other replica, is not refused because of
// them. Without auth (--auth=none) every call is the manager's own.
func (a *admission) holdBody(caller, ns, source string, authenticated bool, n int64) (release func(), ok bool) {
	if n <= SmallBody {
		return func() {}, true
	}
	if !authenticated {
		return hold(a.bodies, n, nil)
	}
	if a.proven.has(caller) {
		leave, ok := a.shares(caller, ns, source, n)
		if !ok {
			return nil, false
		}
		return hold(a.bodies, n, leave)
	}
	if n <= LargeBody {
		leave, ok := a.unprovenBodies.Enter(caller, unprovenPerCaller)
		if !ok {
			return nil, false
		}
		return hold(a.unproven, n, leave)
	}
	leave, ok := a.unprovenLargeBodies.Enter(caller, 1)
	if !ok {
		return nil, false
	}
	return hold(a.unprovenLarge, n, leave)
}

// shares takes n bytes from the caller's, its namespace's and its
// source's shares, or none of them.
func (a *admission) shares(caller, ns, source string, n int64) (leave func(), ok bool) {
	var taken []func()
	undo := func() {
		for _, f := range taken {
			f()
		}
	}
	for _, s := range []struct {
		c    *sources.Tally
		key  string
		most int64
	}{{&a.perCallerBytes, caller, a.perCallerMost}, {&a.perNamespaceBytes, ns, a.perNamespaceMost}, {&a.perSourceBytes, source, a.perSourceMost}} {
		if s.key == "" {
			continue
		}
		f, ok := s.c.Take(s.key, n, s.most)
		if !ok {
			undo()
			return nil, false
		}
		taken = append(taken, f)
	}
	return sync.OnceFunc(undo), true
}

// SmallBody is the size up to which a call's body is never refused for
// memory: a call of a few renews or releases with names and owners of the
// longest fits.
const SmallBody = 4 << 10

// unprovenPerCaller is how many small bodies a caller not yet authorized
// may have in flight: pods of one ServiceAccount share a name, and a
// rollout's pods call at once.
const unprovenPerCaller = 4

// hold takes n from pool, then leave (when set) goes with it.
func hold(pool *semaphore.Weighted, n int64, leave func()) (release func(), ok bool) {
	if !pool.TryAcquire(n) {
		if leave != nil {
			leave()
		}
		return nil, false
	}
	return sync.OnceFunc(func() {
		pool.Release(n)
		if leave != nil {
			leave()
		}
	}), true
}

// provenFor is how long an authorized call vouches for its caller's body
// memory; maxProven bounds the callers remembered (past it, the record
// starts over: callers then prove themselves again with a call).
const (
	provenFor = 10 * time.Minute
	maxProven = 1 << 16
)

// provenCallers are the callers recently authorized for some call.
type provenCallers struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (p *provenCallers) has(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.at[name]
	return ok && time.Since(t) < provenFor
}

// set records that name was authorized (ok) or refused (!ok) just now.
func (p *provenCallers) set(name string, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !ok {
		delete(p.at, name)
		return
	}
	if p.at == nil || len(p.at) >= maxProven {
		p.at = map[string]time.Time{}
	}
	p.at[name] = time.Now()
}
