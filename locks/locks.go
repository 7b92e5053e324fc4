// Package locks carries out the lock operations (acquire, renew, release,
// get, check) as Kubernetes writes on QueenLock permits. The HTTP route and
// the handles' direct transport both run them, so a lock behaves the same
// whichever way a caller reaches it.
//
// Each operation is one conditional write when it wins: acquire creates the
// permit, renew patches it and release deletes it, each with the token as
// the resourceVersion precondition where there is one. Reads happen only
// after a write loses, to say why (already, held, lost) or to carry a stale
// token of the same owner through. Those reads go to the API server itself:
// the client given to New must not be backed by an informer cache, which
// can be behind, and a decision on stale data answers wrongly.
package locks

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// Reasons an operation did not get what it asked for, as the contract names them.
const (
	ReasonHeld           = permit.ReasonHeld
	ReasonLost           = permit.ReasonLost
	ReasonContended      = "contended"
	ReasonQuota          = "quota"
	ReasonKVPrecondition = "kv_precondition"
)

// DefaultTries bounds how many times an operation reads and tries again
// after losing a race, before it answers contended (acquire) or gives up.
const DefaultTries = 4

// Holder is one held permit of a lock.
type Holder struct {
	Slot      int
	Owner     string
	Token     uint64
	Since     time.Time
	RenewedAt time.Time
	ExpiresAt time.Time
}

// Permit is a permit the caller holds after an acquire or a renew.
type Permit struct {
	Slot      int
	Token     uint64
	Owner     string
	ExpiresAt time.Time
}

// Acquired is the answer to an acquire. When Acquired is false, Reason says
// why and Holders lists who holds the slots the caller can see.
type Acquired struct {
	Acquired bool
	Already  bool
	Permit
	Reason  string
	Holders []Holder
}

// Renewed is the answer to a renew.
type Renewed struct {
	Renewed bool
	Permit
	Reason string
}

// Version is what is known of one version of a permit. A version never
// changes, so whatever has seen it (an earlier answer, an informer) can
// tell its owner and expiry; a write conditional on that resourceVersion
// then proves it is still the current one.
type Version struct {
	Owner      string
	ExpireTime time.Time
}

// Versions looks up one exact version of a permit by namespace, name and
// resourceVersion. It answers false when it has not seen that version.
type Versions interface {
	Version(ns, name, resourceVersion string) (Version, bool)
}

// Client runs lock operations against the API server.
type Client struct {
	c        client.Client
	clock    clock.PassiveClock
	tries    int
	grace    time.Duration
	versions Versions
	answered *memo
	deletes  dynamic.Interface // nil: deletes go through c
}

// Option adjusts a Client.
type Option func(*Client)

// WithGrace makes acquire take over a permit only once it expired more than
// grace ago: the clock skew tolerated between the replicas that stamp and
// judge expiry. The webhook enforces the same; this only spares a write
// that would be refused.
func WithGrace(grace time.Duration) Option { return func(l *Client) { l.grace = grace } }

// WithVersions adds a source of permit versions (the manager's informer)
// that release consults before it falls back to a read.
func WithVersions(v Versions) Option { return func(l *Client) { l.versions = v } }

// New returns a Client over c, which must read from the API server (no cache).
func New(c client.Client, clk clock.PassiveClock, opts ...Option) *Client {
	if clk == nil {
		clk = clock.RealClock{}
	}
	l := &Client{c: c, clock: clk, tries: DefaultTries, answered: newMemo(100000)}
	for _, o := range opts {
		o(l)
	}
	return l
}

// MintOwner makes an owner for a caller that sent none.
func MintOwner(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// AcquireOption adjusts one acquire.
type AcquireOption func(*acquireConfig)

type acquireConfig struct {
	pod   *locksv1alpha1.PodRef
	wait  time.Duration
	waker Waker
	// freed is the slot a wake said had freed, tried first; -1 when none.
	freed int
}

// Waker tells a waiting acquire when a permit of its lock may have freed.
type Waker interface {
	// Wait queues a waiter for a semaphore of limit; false when no more
	// may wait.
	Wait(ns, lock string, limit int) (Waiter, bool)
}

// Waiter is one queued acquire.
type Waiter interface {
	// C is signalled when a slot may have freed, with that slot when it
	// is known and -1 otherwise.
	C() <-chan int
	// Tried says how a try went: won, or lost to a holder. A try that
	// failed otherwise is not reported.
	Tried(won bool)
	// Done leaves the queue.
	Done()
}

// WaitUpTo lets an acquire wait up to d for a slot to free, woken by w.
// When w has no room for another waiter, the acquire answers at once.
func WaitUpTo(d time.Duration, w Waker) AcquireOption {
	return func(c *acquireConfig) { c.wait, c.waker = d, w }
}

// tryTimeout bounds one try of a waiting acquire, which runs to its end
// even when the caller goes away, so that what it won can be given back.
const tryTimeout = 15 * time.Second

// HolderPod records the holder's pod on the permit, so that the permit is
// freed as soon as that pod is gone. The pod's namespace need not be the
// permit's; empty means the writer's own pod's namespace (the webhook fills
// it in). An empty name records none.
func HolderPod(namespace, name, uid string) AcquireOption {
	return func(c *acquireConfig) {
		if name != "" {
			c.pod = &locksv1alpha1.PodRef{Namespace: namespace, Name: name, UID: uid}
		}
	}
}

// acquire is one acquire in progress.
type acquire struct {
	ns, lock, owner string
	ttl             int64
	limit           int
	acquireConfig
}

// Acquire takes a free or expired slot of lock, a semaphore of limit, for
// owner. An owner that already holds a slot gets that slot back with
// Already: an owner never holds two slots of one lock.
//
// A lock (limit 1) costs one create when it is free; only when the name
// exists does it read that one permit, to answer already or held, or to
// take an expired permit over. A semaphore first creates the owner's
// preferred slot (a hash of the owner; after a wake, the slot that freed),
// then lists the lock's permits to make sure no concurrent acquire of the
// same owner won another slot first; see settle.
func (l *Client) Acquire(ctx context.Context, ns, lock, owner string, ttlSeconds int64, limit int, opts ...AcquireOption) (Acquired, error) {
	a := &acquire{ns: ns, lock: lock, owner: owner, ttl: ttlSeconds, limit: limit, acquireConfig: acquireConfig{freed: -1}}
	for _, o := range opts {
		o(&a.acquireConfig)
	}
	if a.wait > 0 && a.waker != nil {
		return l.acquireWaiting(ctx, a)
	}
	return l.acquireOnce(ctx, a)
}

func (l *Client) acquireOnce(ctx context.Context, a *acquire) (Acquired, error) {
	if a.limit <= 1 {
		return l.acquireLock(ctx, a)
	}
	return l.acquireSemaphore(ctx, a)
}

// acquireWaiting tries, and while the lock is held waits for a wake and
// tries again, until it wins or the wait is over; then it answers as a
// plain acquire would. The waiter is queued before the first try, so a
// release between that try and the wait is not missed.
//
// A caller that went away never acquires: each try runs to its end on its
// own, and a permit won by a try the caller no longer waits for is
// released at once.
func (l *Client) acquireWaiting(ctx context.Context, a *acquire) (Acquired, error) {
	w, ok := a.waker.Wait(a.ns, a.lock, a.limit)
	if !ok {
		// No room to wait: one try, which a caller going away does not
		// cut short, so that a permit it won is given back, not left
		// held until its TTL.
		return l.try(ctx, a)
	}
	defer w.Done()
	deadline := time.NewTimer(a.wait)
	defer deadline.Stop()
	last := false
	for {
		if err := ctx.Err(); err != nil {
			return Acquired{}, err
		}
		got, err := l.try(ctx, a)
		lost := err == nil && (got.Reason == ReasonHeld || got.Reason == ReasonContended)
		if err == nil && (got.Acquired || lost) {
			w.Tried(got.Acquired)
		}
		if last || !lost {
			return got, err
		}
		select {
		case a.freed = <-w.C():
		case <-deadline.C:
			last = true
		case <-ctx.Done():
			return Acquired{}, ctx.Err()
		}
	}
}

// try is one acquire that the caller's going away does not cut short.
func (l *Client) try(ctx context.Context, a *acquire) (Acquired, error) {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tryTimeout)
	defer cancel()
	got, err := l.acquireOnce(tctx, a)
	if err == nil && got.Acquired && !got.Already && ctx.Err() != nil {
		// Nobody waits for this answer any more: give the slot back.
		if _, rerr := l.Release(tctx, a.ns, a.lock, got.Slot, got.Token, a.owner); rerr != nil {
			return Acquired{}, fmt.Errorf("the caller went away while acquiring lock %q, and releasing the slot it won failed: %w", a.lock, rerr)
		}
		return Acquired{}, ctx.Err()
	}
	return got, err
}

func (l *Client) acquireLock(ctx context.Context, a *acquire) (Acquired, error) {
	for try := 0; try < l.tries; try++ {
		got, reason, err := l.create(ctx, a, 0)
		if err != nil || got != nil {
			return l.won(got, "", err)
		}
		// The name exists, or the quota refused the create before the
		// API server looked for the name: either way the permit may be
		// there, and who holds it decides the answer.
		p, err := l.get(ctx, a.ns, a.lock, 0)
		if err != nil {
			return Acquired{}, err
		}
		if p == nil {
			if reason == ReasonQuota {
				return Acquired{Reason: ReasonQuota}, nil
			}
			continue // released or being deleted since the create: try again
		}
		now := l.clock.Now()
		if !permit.Expired(p, now) {
			h, err := holderOf(p)
			if err != nil {
				return Acquired{}, err
			}
			if p.Spec.Owner == a.owner {
				l.remember(p)
				return Acquired{Acquired: true, Already: true, Permit: h.permit()}, nil
			}
			return Acquired{Reason: ReasonHeld, Holders: []Holder{h}}, nil
		}
		if !l.takeable(p, now) {
			h, err := holderOf(p)
			if err != nil {
				return Acquired{}, err
			}
			return Acquired{Reason: ReasonHeld, Holders: []Holder{h}}, nil
		}
		got, err = l.takeOver(ctx, p, a)
		if err != nil || got != nil {
			return l.won(got, "", err)
		}
	}
	return Acquired{Reason: ReasonContended}, nil
}

func (l *Client) won(got *locksv1alpha1.QueenLock, reason string, err error) (Acquired, error) {
	switch {
	case err != nil:
		return Acquired{}, err
	case reason != "":
		return Acquired{Reason: reason}, nil
	}
	h, err := holderOf(got)
	if err != nil {
		return Acquired{}, err
	}
	l.remember(got)
	return Acquired{Acquired: true, Permit: h.permit()}, nil
}

func (l *Client) acquireSemaphore(ctx context.Context, a *acquire) (Acquired, error) {
	first := preferredSlot(a.owner, a.limit)
	if a.freed >= 0 && a.freed < a.limit {
		// Woken by a slot that freed: that one is the likeliest free.
		first = a.freed
	}
	got, reason, err := l.create(ctx, a, first)
	if err != nil {
		return Acquired{}, err
	}
	if got != nil {
		return l.settle(ctx, a, got)
	}
	// The slot is taken, or the quota refused a new permit: the list
	// tells whether the owner already holds one, who holds the rest, and
	// which expired permits can be taken over without a new one.
	quota := reason == ReasonQuota
	for try := 0; try < l.tries; try++ {
		bySlot, err := l.list(ctx, a.ns, a.lock)
		if err != nil {
			return Acquired{}, err
		}
		now := l.clock.Now()
		if mine := earliest(live(bySlot, a.owner, now)); mine != nil {
			h, err := holderOf(mine)
			if err != nil {
				return Acquired{}, err
			}
			l.remember(mine)
			return Acquired{Acquired: true, Already: true, Permit: h.permit()}, nil
		}
		var holders []Holder
		var free, takeable []int
		for i := range a.limit {
			// Start at the preferred slot, so that owners spread out.
			slot := (first + i) % a.limit
			p, taken := bySlot[slot]
			switch {
			case !taken:
				free = append(free, slot)
			case !permit.Expired(p, now):
				// The larger limit rules: a caller with a smaller limit
				// shares the low slots and does not see the others.
				h, err := holderOf(p)
				if err != nil {
					return Acquired{}, err
				}
				holders = append(holders, h)
			case l.takeable(p, now):
				takeable = append(takeable, slot)
			default:
				h, err := holderOf(p)
				if err != nil {
					return Acquired{}, err
				}
				holders = append(holders, h)
			}
		}
		if len(free) == 0 && len(takeable) == 0 {
			sortHolders(holders)
			return Acquired{Reason: ReasonHeld, Holders: holders}, nil
		}
		for _, slot := range free {
			if quota {
				break // a new permit is refused; a takeover is not charged
			}
			got, reason, err := l.create(ctx, a, slot)
			if err != nil {
				return Acquired{}, err
			}
			if got != nil {
				return l.settle(ctx, a, got)
			}
			quota = reason == ReasonQuota
		}
		for _, slot := range takeable {
			got, err := l.takeOver(ctx, bySlot[slot], a)
			if err != nil {
				return Acquired{}, err
			}
			if got != nil {
				return l.settle(ctx, a, got)
			}
		}
		if quota && len(takeable) == 0 {
			return Acquired{Reason: ReasonQuota}, nil
		}
	}
	if quota {
		return Acquired{Reason: ReasonQuota}, nil
	}
	return Acquired{Reason: ReasonContended}, nil
}

// settle makes sure the owner of the permit just won holds no other slot:
// two acquires of one owner (a retry while the first is in flight, or two
// processes sharing an owner) can each create a different slot. It lists
// the lock's permits, after the write, and keeps the owner's permit that
// was acquired first; if that is not got, it deletes got and answers the
// earlier one as already held. Every acquire of the owner that wins a
// write settles this way, and a list after a write sees every write before
// it, so all of them answer the same permit.
func (l *Client) settle(ctx context.Context, a *acquire, got *locksv1alpha1.QueenLock) (Acquired, error) {
	bySlot, err := l.list(ctx, a.ns, a.lock)
	if err != nil {
		return Acquired{}, fmt.Errorf("checking that owner %q holds one slot of lock %q: %w", a.owner, a.lock, err)
	}
	mine := live(bySlot, a.owner, l.clock.Now())
	keep := earliest(append(mine, got))
	if keep.Name == got.Name {
		return l.won(got, "", nil)
	}
	rv := got.ResourceVersion
	err = l.delete(ctx, got.Namespace, got.Name, metav1.Preconditions{UID: &got.UID, ResourceVersion: &rv})
	if err != nil && !apierrors.IsNotFound(err) {
		return Acquired{}, fmt.Errorf("giving back slot %d of lock %q, won twice by owner %q: %w", got.Spec.Slot, a.lock, a.owner, err)
	}
	h, err := holderOf(keep)
	if err != nil {
		return Acquired{}, err
	}
	l.remember(keep)
	return Acquired{Acquired: true, Already: true, Permit: h.permit()}, nil
}

// live is the owner's permits that have not expired at now.
func live(bySlot map[int]*locksv1alpha1.QueenLock, owner string, now time.Time) []*locksv1alpha1.QueenLock {
	var ps []*locksv1alpha1.QueenLock
	for _, p := range bySlot {
		if p.Spec.Owner == owner && !permit.Expired(p, now) {
			ps = append(ps, p)
		}
	}
	return ps
}

// earliest is the permit that was acquired first. A permit that has been
// renewed was acquired before any that has not: its owner had its answer
// and renewed it, so any later acquire of the same owner had seen it when
// settling. Among permits never renewed, the resourceVersion of the
// acquiring write orders them as the API server did.
func earliest(ps []*locksv1alpha1.QueenLock) *locksv1alpha1.QueenLock {
	var best *locksv1alpha1.QueenLock
	var bestTok uint64
	bestRenewed := false
	for _, p := range ps {
		tok, _ := permit.Token(p.ResourceVersion)
		renewed := p.Spec.AcquireTime != nil && p.Spec.RenewTime != nil && !p.Spec.RenewTime.Equal(p.Spec.AcquireTime)
		switch {
		case best == nil,
			renewed && !bestRenewed,
			renewed == bestRenewed && (tok < bestTok || (tok == bestTok && p.Spec.Slot < best.Spec.Slot)):
			best, bestTok, bestRenewed = p, tok, renewed
		}
	}
	return best
}

// preferredSlot spreads owners over a semaphore's slots, so that a
// semaphore with room usually costs one create and one list.
func preferredSlot(owner string, limit int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(owner))
	return int(h.Sum32() % uint32(limit))
}

// takeable tells whether an expired permit may be taken over at now: it
// expired more than the grace ago.
func (l *Client) takeable(p *locksv1alpha1.QueenLock, now time.Time) bool {
	return permit.Expired(p, now.Add(-l.grace))
}

// list reads every permit of lock in ns, by slot, leaving out permits that
// are being deleted.
func (l *Client) list(ctx context.Context, ns, lock string) (map[int]*locksv1alpha1.QueenLock, error) {
	var list locksv1alpha1.QueenLockList
	if err := l.c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{permit.LockLabel: permit.LabelValue(lock)}); err != nil {
		return nil, fmt.Errorf("listing permits of lock %q: %w", lock, err)
	}
	bySlot := make(map[int]*locksv1alpha1.QueenLock, len(list.Items))
	for i := range list.Items {
		p := &list.Items[i]
		if p.Spec.Lock == lock && p.DeletionTimestamp.IsZero() {
			bySlot[int(p.Spec.Slot)] = p
		}
	}
	return bySlot, nil
}

// get reads one permit; nil when it does not exist or is being deleted.
func (l *Client) get(ctx context.Context, ns, lock string, slot int) (*locksv1alpha1.QueenLock, error) {
	p := &locksv1alpha1.QueenLock{}
	err := l.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: permit.Name(lock, slot)}, p)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading permit %d of lock %q: %w", slot, lock, err)
	}
	if p.Spec.Lock != lock || !p.DeletionTimestamp.IsZero() {
		return nil, nil
	}
	return p, nil
}

// create acquires a free slot. It answers nil with no reason when the name
// exists (another caller's create won it), and reason quota when the
// namespace's ResourceQuota for permits refused it: the quota is checked
// before the name, so the permit may exist all the same.
func (l *Client) create(ctx context.Context, a *acquire, slot int) (*locksv1alpha1.QueenLock, string, error) {
	p := &locksv1alpha1.QueenLock{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: a.ns,
			Name:      permit.Name(a.lock, slot),
			Labels:    map[string]string{permit.LockLabel: permit.LabelValue(a.lock)},
		},
		Spec: locksv1alpha1.QueenLockSpec{Lock: a.lock, Slot: int32(slot), Limit: int32(a.limit), Owner: a.owner, TTLSeconds: a.ttl, HolderPod: a.pod},
	}
	err := l.c.Create(ctx, p)
	switch {
	case err == nil:
		return p, "", nil
	case apierrors.IsAlreadyExists(err) || isLostRace(err):
		return nil, "", nil
	case isQuota(err):
		return nil, ReasonQuota, nil
	}
	return nil, "", fmt.Errorf("creating permit %d of lock %q: %w", slot, a.lock, err)
}

// takeOver acquires an expired permit: an update that clears acquireTime,
// conditional on the resourceVersion that was judged expired. It answers nil
// when the permit changed first (renewed, taken or released).
func (l *Client) takeOver(ctx context.Context, old *locksv1alpha1.QueenLock, a *acquire) (*locksv1alpha1.QueenLock, error) {
	p := old.DeepCopy()
	p.Spec.Owner = a.owner
	p.Spec.TTLSeconds = a.ttl
	p.Spec.Limit = int32(max(a.limit, int(p.Spec.Slot)+1))
	p.Spec.HolderPod = a.pod
	p.Spec.AcquireTime = nil
	err := l.c.Update(ctx, p)
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) || isLostRace(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("taking over permit %d of lock %q: %w", old.Spec.Slot, old.Spec.Lock, err)
	}
	return p, nil
}

// Renew extends the caller's permit by ttlSeconds (0 keeps its lifetime)
// and answers the new token. It is one merge patch conditional on the
// token; the webhook refuses it when the owner differs or the permit has
// expired. When the token is stale it reads the permit once: a token that
// is stale only because the same owner's earlier renew landed is carried
// through to the current one.
func (l *Client) Renew(ctx context.Context, ns, lock string, slot int, token uint64, owner string, ttlSeconds int64) (Renewed, error) {
	name := permit.Name(lock, slot)
	rv := strconv.FormatUint(token, 10)
	for try := 0; try < l.tries; try++ {
		p, err := l.patchRenew(ctx, ns, name, rv, owner, ttlSeconds)
		switch {
		case err == nil:
			// Another lock's permit under a hashed name cannot be ours. A
			// permit being deleted is released: the webhook passes a write
			// to it unstamped, and a renew that changed nothing would
			// otherwise answer renewed with the old lifetime.
			if p.Spec.Lock != lock || !p.DeletionTimestamp.IsZero() {
				return Renewed{Reason: ReasonLost}, nil
			}
			h, err := holderOf(p)
			if err != nil {
				return Renewed{}, err
			}
			l.remember(p)
			return Renewed{Renewed: true, Permit: h.permit()}, nil
		case apierrors.IsNotFound(err) || isLostRace(err):
			return Renewed{Reason: ReasonLost}, nil
		case apierrors.IsConflict(err):
			// Written since the caller's token: read it, it may still be ours.
			cur, err := l.current(ctx, ns, lock, slot, token, owner)
			if err != nil || cur == nil {
				return Renewed{Reason: ReasonLost}, err
			}
			rv = cur.ResourceVersion
		default:
			return Renewed{}, fmt.Errorf("renewing permit %d of lock %q: %w", slot, lock, err)
		}
	}
	return Renewed{Reason: ReasonLost}, nil
}

// patchRenew writes a renew of version rv: the owner (so that another
// owner's renew is refused) and the lifetime.
func (l *Client) patchRenew(ctx context.Context, ns, name, rv, owner string, ttl int64) (*locksv1alpha1.QueenLock, error) {
	spec := map[string]any{}
	if owner != "" {
		spec["owner"] = owner
	}
	if ttl > 0 {
		spec["ttlSeconds"] = ttl
	}
	body := map[string]any{"metadata": map[string]any{"resourceVersion": rv}}
	if len(spec) > 0 {
		body["spec"] = spec
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	p := &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	return p, l.c.Patch(ctx, p, client.RawPatch(types.MergePatchType, raw))
}

// Release deletes the caller's permit: one delete conditional on the token.
// It answers false (lost) when the permit was no longer the caller's, and
// also when its lifetime had ended, though it deletes that version all the
// same: nobody else holds it, and its slot frees at once. The expiry of
// the version comes from this client's own answers or the Versions
// source; when neither has seen it, one read comes first.
func (l *Client) Release(ctx context.Context, ns, lock string, slot int, token uint64, owner string) (released bool, err error) {
	name := permit.Name(lock, slot)
	rv := strconv.FormatUint(token, 10)
	for try := 0; try < l.tries; try++ {
		v, ok := l.version(ns, name, rv)
		if !ok {
			p, err := l.current(ctx, ns, lock, slot, token, owner)
			if err != nil || p == nil {
				return false, err
			}
			rv, v = p.ResourceVersion, Version{Owner: p.Spec.Owner, ExpireTime: p.Spec.ExpireTime.Time}
		} else if owner != "" && v.Owner != owner {
			return false, nil
		}
		err := l.delete(ctx, ns, name, metav1.Preconditions{ResourceVersion: &rv})
		switch {
		case err == nil:
			l.answered.forget(ns, name)
			return l.clock.Now().Before(v.ExpireTime), nil
		case apierrors.IsConflict(err):
			// Written since: read it, a stale token of the same owner is
			// carried through.
			p, err := l.current(ctx, ns, lock, slot, token, owner)
			if err != nil || p == nil {
				return false, err
			}
			l.remember(p)
			rv = p.ResourceVersion
		case apierrors.IsNotFound(err):
			return false, nil
		default:
			return false, fmt.Errorf("releasing permit %d of lock %q: %w", slot, lock, err)
		}
	}
	return false, nil
}

func (l *Client) version(ns, name, rv string) (Version, bool) {
	if v, ok := l.answered.get(ns, name, rv); ok {
		return v, true
	}
	if l.versions != nil {
		return l.versions.Version(ns, name, rv)
	}
	return Version{}, false
}

func (l *Client) remember(p *locksv1alpha1.QueenLock) {
	if p.Spec.ExpireTime != nil {
		l.answered.put(p.Namespace, p.Name, p.ResourceVersion, Version{Owner: p.Spec.Owner, ExpireTime: p.Spec.ExpireTime.Time})
	}
}

// current reads the permit and answers it when the caller still holds it:
// not expired, and either the token is current (and the owner, when given,
// matches) or the owner matches and the token lies within the current
// holding, from its first token (recorded on the permit by the webhook at
// the first renew) to the current one: an earlier renew of the caller's
// landed and its answer was lost. The permit itself says where the holding
// began, so every replica answers alike, after restarts too. An owner name
// alone does not make a stale token current: a process paused through its
// holding's end, sharing its owner with a later holding, holds a token
// below that holding's first. It answers nil when the permit is lost to
// the caller.
func (l *Client) current(ctx context.Context, ns, lock string, slot int, token uint64, owner string) (*locksv1alpha1.QueenLock, error) {
	p, err := l.get(ctx, ns, lock, slot)
	if err != nil || p == nil {
		return nil, err
	}
	if permit.Expired(p, l.clock.Now()) {
		return nil, nil
	}
	now, err := permit.Token(p.ResourceVersion)
	if err != nil {
		return nil, err
	}
	sameOwner := owner != "" && owner == p.Spec.Owner
	switch {
	case token == now && (owner == "" || sameOwner):
		return p, nil
	case token < now && sameOwner && p.Spec.FirstToken > 0 && token >= uint64(p.Spec.FirstToken):
		return p, nil
	default:
		return nil, nil
	}
}

// Get lists the holders of lock: the permits that have not expired.
func (l *Client) Get(ctx context.Context, ns, lock string) ([]Holder, error) {
	bySlot, err := l.list(ctx, ns, lock)
	if err != nil {
		return nil, err
	}
	now := l.clock.Now()
	holders := []Holder{}
	for _, p := range bySlot {
		if permit.Expired(p, now) {
			continue
		}
		h, err := holderOf(p)
		if err != nil {
			return nil, err
		}
		holders = append(holders, h)
	}
	sortHolders(holders)
	return holders, nil
}

// Check tells whether slot of lock is held with exactly the token expect.
func (l *Client) Check(ctx context.Context, ns, lock string, slot int, expect uint64) (bool, error) {
	p, err := l.get(ctx, ns, lock, slot)
	if err != nil || p == nil {
		return false, err
	}
	if permit.Expired(p, l.clock.Now()) {
		return false, nil
	}
	tok, err := permit.Token(p.ResourceVersion)
	if err != nil {
		return false, err
	}
	return tok == expect, nil
}

// isLostRace tells whether the admission webhook refused a write because the
// permit was held or lost, a race the caller lost rather than a failure.
func isLostRace(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false
	}
	switch string(status.Status().Reason) {
	case permit.ReasonHeld, permit.ReasonLost:
		return true
	}
	return false
}

// isQuota tells whether the ResourceQuota admission refused a create: the
// namespace may hold no more permits.
func isQuota(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota")
}

func holderOf(p *locksv1alpha1.QueenLock) (Holder, error) {
	tok, err := permit.Token(p.ResourceVersion)
	if err != nil {
		return Holder{}, err
	}
	h := Holder{Slot: int(p.Spec.Slot), Owner: p.Spec.Owner, Token: tok}
	if t := p.Spec.AcquireTime; t != nil {
		h.Since = t.Time
	}
	if t := p.Spec.RenewTime; t != nil {
		h.RenewedAt = t.Time
	}
	if t := p.Spec.ExpireTime; t != nil {
		h.ExpiresAt = t.Time
	}
	return h, nil
}

func (h Holder) permit() Permit {
	return Permit{Slot: h.Slot, Token: h.Token, Owner: h.Owner, ExpiresAt: h.ExpiresAt}
}

func sortHolders(hs []Holder) { sort.Slice(hs, func(i, j int) bool { return hs[i].Slot < hs[j].Slot }) }

// CachedVersions is a Versions source over an informer cache, such as the
// manager's. The cache may be behind or ahead of the caller: it answers only
// when it holds exactly the version asked for.
func CachedVersions(r client.Reader) Versions { return cachedVersions{r} }

type cachedVersions struct{ r client.Reader }

func (c cachedVersions) Version(ns, name, rv string) (Version, bool) {
	// The informer is already synced in a running manager; the timeout only
	// keeps a release from waiting on a cache that is not.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var p locksv1alpha1.QueenLock
	if err := c.r.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil ||
		p.ResourceVersion != rv || p.Spec.ExpireTime == nil || !p.DeletionTimestamp.IsZero() {
		return Version{}, false
	}
	return Version{Owner: p.Spec.Owner, ExpireTime: p.Spec.ExpireTime.Time}, true
}
