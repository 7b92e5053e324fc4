package locks

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// AcquireOption adjusts one acquire.
type AcquireOption func(*acquireConfig)

type acquireConfig struct {
	pod   *locksv1alpha1.PodRef
	wait  time.Duration
	waker Waker
	// freed is the slot a wake said had freed, tried first; -1 when none.
	freed int
	// keep answers what a try won after the caller left (KeepWhenGone).
	keep bool
	// queued is set while the acquire waits in its lock's line: it may
	// take what frees when its turn comes.
	queued bool
	// from is the lowest slot a queued try may take: the slots below are
	// those of waiters ahead of it with a smaller limit, which it passes
	// for the slots above only (see turn).
	from int
}

// HolderPod records the holder's pod on the permit, so that the permit is
// freed as soon as that pod is gone. The pod's namespace need not be the
// permit's; empty means the writer's own pod's namespace (the webhook fills
// it in), or the permit's when the writer is the manager (AsManager). An
// empty name records none.
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
// owner. An owner that already holds a slot, in any slot (a higher one
// too, taken when the limit was larger), gets that slot back with Already
// and nothing is written: an owner never holds two slots of one lock.
//
// A lock (limit 1) first creates slot 0. When the name exists it lists
// the lock's permits, to answer already or held, or to take an expired
// permit over. A semaphore lists the lock's permits first, so that its
// owner's repeat writes nothing, then creates or takes over a slot (its
// preferred one, a hash of the owner, when free; after a wake, the slot
// that freed). Every acquire that wrote then lists the lock's permits at
// the version of its write, to make sure no concurrent acquire of the
// same owner won another slot first; see settle.
func (l *Client) Acquire(ctx context.Context, ns, lock, owner string, ttlSeconds int64, limit int, opts ...AcquireOption) (Acquired, error) {
	a := &acquire{ns: ns, lock: lock, owner: owner, ttl: ttlSeconds, limit: limit, acquireConfig: acquireConfig{freed: -1}}
	for _, o := range opts {
		o(&a.acquireConfig)
	}
	got, err := l.acquireAny(ctx, a)
	if err != nil {
		return got, err
	}
	if err := l.countLine(ctx, a, &got); err != nil {
		return got, err
	}
	return l.raise(ctx, ns, lock, got)
}

func (l *Client) acquireOnce(ctx context.Context, a *acquire) (Acquired, error) {
	if a.limit <= 1 {
		return l.acquireLock(ctx, a)
	}
	return l.acquireSemaphore(ctx, a)
}

func (l *Client) acquireLock(ctx context.Context, a *acquire) (Acquired, error) {
	for try := 0; try < l.tries; try++ {
		got, reason, err := l.create(ctx, a, 0)
		if err != nil {
			return Acquired{}, err
		}
		if got != nil {
			// The owner may hold a higher slot, taken with a larger limit
			// (or winning right now with one): settle keeps one. Only a
			// lock that has such slots needs the read.
			if !l.mayHoldAbove0(a.ns, a.lock) {
				return l.won(got, "", nil)
			}
			return l.settle(ctx, a, got)
		}
		// The name exists, or the quota refused the create before the
		// API server looked for the name: either way the permit may be
		// there, and who holds it decides the answer. The list, not a
		// read of slot 0 alone, also finds the owner on a higher slot.
		bySlot, err := l.list(ctx, a.ns, a.lock)
		if err != nil {
			return Acquired{}, err
		}
		now := l.clock.Now()
		if mine := earliest(live(bySlot, a.owner, now)); mine != nil {
			return l.already(mine)
		}
		p := bySlot[0]
		if p == nil {
			if reason == ReasonQuota {
				return Acquired{Reason: ReasonQuota}, nil
			}
			continue // released or being deleted since the create: try again
		}
		yield := !permit.Expired(p, now) || !l.takeable(p, now)
		if !yield {
			// An expired permit with waiters is theirs to take: a plain
			// acquire does not pass the line.
			if yield, err = l.yields(ctx, a); err != nil {
				return Acquired{}, err
			}
		}
		if yield {
			h, err := holderOf(p)
			if err != nil {
				return Acquired{}, err
			}
			return Acquired{Reason: ReasonHeld, Holders: []Holder{h}}, nil
		}
		got, err = l.takeOver(ctx, p, a)
		if err != nil {
			return Acquired{}, err
		}
		if got != nil {
			return l.settle(ctx, a, got)
		}
	}
	return Acquired{Reason: ReasonContended}, nil
}

// already answers the owner's live permit p, which it held before this
// acquire: nothing is written.
func (l *Client) already(p *locksv1alpha1.QueenLock) (Acquired, error) {
	h, err := holderOf(p)
	if err != nil {
		return Acquired{}, err
	}
	l.remember(p)
	return Acquired{Acquired: true, Already: true, Permit: h.permit(), Floor: firstToken(p, h)}, nil
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
	return Acquired{Acquired: true, Permit: h.permit(), Floor: h.Token}, nil
}

// firstToken is the token that began p's holding, whose holder is h: the
// floor its acquire raises the fence to. A holding's later tokens (its
// renews) are above it, every earlier holding's below.
func firstToken(p *locksv1alpha1.QueenLock, h Holder) uint64 {
	if p.Spec.FirstToken > 0 {
		return uint64(p.Spec.FirstToken)
	}
	return h.Token
}

func (l *Client) acquireSemaphore(ctx context.Context, a *acquire) (Acquired, error) {
	first := preferredSlot(a.owner, a.limit)
	if a.freed >= 0 && a.freed < a.limit {
		// Woken by a slot that freed: that one is the likeliest free.
		first = a.freed
	}
	// The list comes first: an owner that holds a slot already is
	// answered with it and nothing is written. It also tells who holds
	// the rest, and which expired permits can be taken over without a
	// new one.
	quota := false
	for try := 0; try < l.tries; try++ {
		bySlot, err := l.list(ctx, a.ns, a.lock)
		if err != nil {
			return Acquired{}, err
		}
		now := l.clock.Now()
		if mine := earliest(live(bySlot, a.owner, now)); mine != nil {
			return l.already(mine)
		}
		var holders []Holder
		var free, takeable []int
		hold := func(p *locksv1alpha1.QueenLock) error {
			h, err := holderOf(p)
			holders = append(holders, h)
			return err
		}
		for i := range a.limit {
			// Start at the preferred slot, so that owners spread out.
			slot := (first + i) % a.limit
			p, taken := bySlot[slot]
			var err error
			switch {
			case a.queued && slot < a.from:
				// A waiter ahead of it waits for this one (see turn).
				if taken && !permit.Expired(p, now) {
					err = hold(p)
				}
			case !taken:
				free = append(free, slot)
			case !permit.Expired(p, now):
				// The larger limit rules: a caller with a smaller limit
				// shares the low slots and does not see the others.
				err = hold(p)
			case l.takeable(p, now):
				takeable = append(takeable, slot)
			default:
				err = hold(p)
			}
			if err != nil {
				return Acquired{}, err
			}
		}
		yield := len(free) == 0 && len(takeable) == 0
		lineRead := false
		if !yield && len(free) == 0 {
			// Only expired slots: those are the line's, when anyone
			// waits. A free slot is created at once (one write, no read
			// of the line): a slot frees to a waiter by its own create.
			if yield, err = l.yields(ctx, a); err != nil {
				return Acquired{}, err
			}
			lineRead = true
		}
		if yield {
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
		if len(takeable) > 0 && !lineRead {
			// Every free slot was taken first: what is left is expired
			// slots, which are the line's as above.
			y, err := l.yields(ctx, a)
			if err != nil {
				return Acquired{}, err
			}
			if y {
				continue // list again, to answer held with who holds now
			}
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
// write settles this way, and a list at or after a write's version sees
// every write before it, so all of them answer the same permit: the one
// whose write came first, by resourceVersion, keeps its own whatever else
// it sees, and each later one sees it and gives way.
func (l *Client) settle(ctx context.Context, a *acquire, got *locksv1alpha1.QueenLock) (Acquired, error) {
	bySlot, err := l.listSince(ctx, a.ns, a.lock, got.ResourceVersion)
	if err != nil {
		// The caller gets an error, not this permit: give it back, or
		// nobody would release it before its TTL (an owner the route
		// minted is known to nobody). A retry acquires again.
		rv := got.ResourceVersion
		if derr := l.delete(ctx, got.Namespace, got.Name, metav1.Preconditions{UID: &got.UID, ResourceVersion: &rv}); derr != nil && !apierrors.IsNotFound(derr) {
			err = fmt.Errorf("%w (and giving back slot %d failed: %v)", err, got.Spec.Slot, derr) //nolint:errorlint // derr is told, not wrapped: callers sort the error by the list's failure alone
		}
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
	return Acquired{Acquired: true, Already: true, Permit: h.permit(), Floor: firstToken(keep, h)}, nil
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

// create acquires a free slot. It answers nil with no reason when the name
// exists (another caller's create won it), and reason quota when the
// namespace's ResourceQuota for permits refused it: the quota is checked
// before the name, so the permit may exist all the same.
func (l *Client) create(ctx context.Context, a *acquire, slot int) (*locksv1alpha1.QueenLock, string, error) {
	unstamped := func() *locksv1alpha1.QueenLock {
		return &locksv1alpha1.QueenLock{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: a.ns,
				Name:      permit.Name(a.lock, slot),
				Labels:    map[string]string{permit.LockLabel: permit.LabelValue(a.lock)},
			},
			Spec: locksv1alpha1.QueenLockSpec{Lock: a.lock, Slot: int32(slot), Limit: int32(a.limit), Owner: a.owner, TTLSeconds: a.ttl, HolderPod: a.pod},
		}
	}
	p := unstamped()
	if l.stamps {
		if err := l.stampOver(nil, p); err != nil {
			return nil, "", fmt.Errorf("creating permit %d of lock %q: %w", slot, a.lock, err)
		}
	}
	err := l.c.Create(ctx, p)
	if l.stamps && apierrors.IsServiceUnavailable(err) {
		// The admission policy that removes a stamped create's
		// managedFields answers 503 while kube-apiserver has no schema of
		// the CRD for it (seconds after the CRD is installed, or after
		// kube-apiserver starts), failurePolicy Ignore or not: its
		// dispatcher returns that error as it is. An unstamped create is
		// not the policy's (it matches a create with a renewTime) and goes
		// to the webhook, which stamps it, as every create went before the
		// policy. Sent again after any 503: a create that did land makes
		// this one AlreadyExists, a lost race the caller reads as usual.
		p = unstamped()
		err = l.c.Create(ctx, p)
	}
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
	if l.stamps {
		if err := l.stampOver(old, p); err != nil {
			if isLostRace(err) {
				return nil, nil
			}
			return nil, fmt.Errorf("taking over permit %d of lock %q: %w", old.Spec.Slot, old.Spec.Lock, err)
		}
	}
	err := l.c.Update(ctx, p)
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) || isLostRace(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("taking over permit %d of lock %q: %w", old.Spec.Slot, old.Spec.Lock, err)
	}
	return p, nil
}
