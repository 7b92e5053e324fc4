// Package locks carries out the lock operations (acquire, renew, release,
// get, check) as Kubernetes writes on QueenLock permits. The HTTP route and
// the handles' direct transport both run them, so a lock behaves the same
// whichever way a caller reaches it.
//
// Every decision reads from the API server itself. The client given to New
// must not be backed by an informer cache: a cache can be behind, and a
// decision on stale data answers wrongly (held when free, or a second slot to
// an owner that already holds one).
package locks

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	ReasonKVPrecondition = "kv_precondition"
)

// DefaultTries bounds how many times an operation re-reads and tries again
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

// Client runs lock operations against the API server.
type Client struct {
	c     client.Client
	clock clock.PassiveClock
	tries int
}

// New returns a Client over c, which must read from the API server (no cache).
func New(c client.Client, clk clock.PassiveClock) *Client {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Client{c: c, clock: clk, tries: DefaultTries}
}

// MintOwner makes an owner for a caller that sent none.
func MintOwner(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// list reads every permit of lock in ns, by slot.
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

// Acquire takes a free or expired slot of lock, a semaphore of limit, for
// owner. An owner that already holds a slot gets that slot back with Already.
func (l *Client) Acquire(ctx context.Context, ns, lock, owner string, ttlSeconds int64, limit int) (Acquired, error) {
	for try := 0; try < l.tries; try++ {
		bySlot, err := l.list(ctx, ns, lock)
		if err != nil {
			return Acquired{}, err
		}
		now := l.clock.Now()
		var holders []Holder
		for slot, p := range bySlot {
			if permit.Expired(p, now) {
				continue
			}
			if p.Spec.Owner == owner {
				h, err := holderOf(p)
				if err != nil {
					return Acquired{}, err
				}
				return Acquired{Acquired: true, Already: true, Permit: h.permit()}, nil
			}
			// The larger limit rules: a caller with a smaller limit shares
			// the low slots and does not see the others.
			if slot < limit {
				h, err := holderOf(p)
				if err != nil {
					return Acquired{}, err
				}
				holders = append(holders, h)
			}
		}
		if len(holders) >= limit {
			sortHolders(holders)
			return Acquired{Reason: ReasonHeld, Holders: holders}, nil
		}
		for slot := 0; slot < limit; slot++ {
			p, taken := bySlot[slot]
			if taken && !permit.Expired(p, now) {
				continue
			}
			var got *locksv1alpha1.QueenLock
			if taken {
				got, err = l.takeOver(ctx, p, owner, ttlSeconds, limit)
			} else {
				got, err = l.create(ctx, ns, lock, slot, owner, ttlSeconds, limit)
			}
			if err != nil {
				return Acquired{}, err
			}
			if got != nil {
				h, err := holderOf(got)
				if err != nil {
					return Acquired{}, err
				}
				return Acquired{Acquired: true, Permit: h.permit()}, nil
			}
		}
	}
	return Acquired{Reason: ReasonContended}, nil
}

// create acquires a free slot. It answers nil, nil when another caller's
// create won the name first.
func (l *Client) create(ctx context.Context, ns, lock string, slot int, owner string, ttl int64, limit int) (*locksv1alpha1.QueenLock, error) {
	p := &locksv1alpha1.QueenLock{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns,
			Name:      permit.Name(lock, slot),
			Labels:    map[string]string{permit.LockLabel: permit.LabelValue(lock)},
		},
		Spec: locksv1alpha1.QueenLockSpec{Lock: lock, Slot: int32(slot), Limit: int32(limit), Owner: owner, TTLSeconds: ttl},
	}
	err := l.c.Create(ctx, p)
	if apierrors.IsAlreadyExists(err) || isLostRace(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("creating permit %d of lock %q: %w", slot, lock, err)
	}
	return p, nil
}

// takeOver acquires an expired permit: an update that clears acquireTime,
// conditional on the resourceVersion that was judged expired. It answers nil,
// nil when the permit changed first (renewed, taken or released).
func (l *Client) takeOver(ctx context.Context, old *locksv1alpha1.QueenLock, owner string, ttl int64, limit int) (*locksv1alpha1.QueenLock, error) {
	p := old.DeepCopy()
	p.Spec.Owner = owner
	p.Spec.TTLSeconds = ttl
	p.Spec.Limit = int32(max(limit, int(p.Spec.Slot)+1))
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

// Renew extends the caller's permit by ttlSeconds (0 keeps its lifetime) and
// answers the new token. A token that is stale only because the same owner's
// earlier renew landed is carried through to the current one.
func (l *Client) Renew(ctx context.Context, ns, lock string, slot int, token uint64, owner string, ttlSeconds int64) (Renewed, error) {
	for try := 0; try < l.tries; try++ {
		p, err := l.current(ctx, ns, lock, slot, token, owner)
		if err != nil || p == nil {
			return Renewed{Reason: ReasonLost}, err
		}
		if ttlSeconds > 0 {
			p.Spec.TTLSeconds = ttlSeconds
		}
		err = l.c.Update(ctx, p)
		switch {
		case err == nil:
			h, err := holderOf(p)
			if err != nil {
				return Renewed{}, err
			}
			return Renewed{Renewed: true, Permit: h.permit()}, nil
		case apierrors.IsConflict(err):
			continue // written under us: read again, it may still be ours
		case apierrors.IsNotFound(err) || isLostRace(err):
			return Renewed{Reason: ReasonLost}, nil
		default:
			return Renewed{}, fmt.Errorf("renewing permit %d of lock %q: %w", slot, lock, err)
		}
	}
	return Renewed{Reason: ReasonLost}, nil
}

// Release deletes the caller's permit, conditional on its token and UID.
func (l *Client) Release(ctx context.Context, ns, lock string, slot int, token uint64, owner string) (released bool, err error) {
	for try := 0; try < l.tries; try++ {
		p, err := l.current(ctx, ns, lock, slot, token, owner)
		if err != nil || p == nil {
			return false, err
		}
		err = l.c.Delete(ctx, p, client.Preconditions{UID: &p.UID, ResourceVersion: &p.ResourceVersion})
		switch {
		case err == nil:
			return true, nil
		case apierrors.IsConflict(err):
			continue
		case apierrors.IsNotFound(err):
			return false, nil
		default:
			return false, fmt.Errorf("releasing permit %d of lock %q: %w", slot, lock, err)
		}
	}
	return false, nil
}

// current reads the permit and answers it when the caller still holds it:
// not expired, and either the token is current (and the owner, when given,
// matches) or the owner matches and the token is an older one of its own.
// It answers nil when the permit is lost to the caller.
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
	case token < now && sameOwner:
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
