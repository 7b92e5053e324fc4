package locks

import (
	"context"
	"fmt"
	"sort"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// list reads every permit of lock in ns, by slot, leaving out permits that
// are being deleted. The read is consistent: it sees every write that
// ended before it began.
func (l *Client) list(ctx context.Context, ns, lock string) (map[int]*locksv1alpha1.QueenLock, error) {
	return l.listWith(ctx, ns, lock)
}

// listSince is list when the caller needs only the writes up to version
// since (one of its own): it reads at that version or a later one. The
// API server answers a consistent list from its watch cache only once the
// cache has caught up with etcd's newest revision, and when the newest
// write was to another kind than permits, that waits for etcd's next
// progress report, which kube-apiserver asks for every 100 ms. A list not
// older than a permit's own version waits only for that permit's event.
// Writes after since may or may not show.
//
// A watch cache that is far behind holds such a list for 3 s and then
// answers 504, with no fallback to etcd (a consistent list has one), and
// client-go would retry it: after sinceTimeout the list is read
// consistently instead.
func (l *Client) listSince(ctx context.Context, ns, lock, since string) (map[int]*locksv1alpha1.QueenLock, error) {
	sctx, cancel := context.WithTimeout(ctx, sinceTimeout)
	bySlot, err := l.listWith(sctx, ns, lock, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: since, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan}})
	cancel()
	if err == nil || ctx.Err() != nil {
		return bySlot, err
	}
	return l.list(ctx, ns, lock)
}

// sinceTimeout bounds a list at a version: kube-apiserver's 3 s wait for
// its watch cache, and a little more.
const sinceTimeout = 4 * time.Second

func (l *Client) listWith(ctx context.Context, ns, lock string, extra ...client.ListOption) (map[int]*locksv1alpha1.QueenLock, error) {
	var list locksv1alpha1.QueenLockList
	opts := append([]client.ListOption{client.InNamespace(ns), client.MatchingLabels{permit.LockLabel: permit.LabelValue(lock)}}, extra...)
	if err := l.c.List(ctx, &list, opts...); err != nil {
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
