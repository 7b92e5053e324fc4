package locks

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// A slot that frees while its lock's line waits for it goes to the head of
// the line in place (permit.Handed): the release, expiry or end of the
// holder's pod rewrites the permit for that waiter rather than deleting
// it, so the slot is never free while anyone waits for it, and an acquire
// outside the line cannot take it in between. The waiter learns it from
// its watch (a permit of its owner) or its next try, and its acquire
// answers it (see already).

// HeadFor is the waiter at the head of the line that can use the slot of
// permit old, whose holding ends: the first, in the line's order, whose
// limit reaches the slot and whose owner holds no live permit of the lock
// (ps) but old. The waiter old was handed to is passed over: it had the
// slot and let its lifetime run out (its carrier is gone, or left), and so
// is any waiter of old's own owner: a holding given back (a gated pod the
// gate could not let in) goes on to the next, not to itself. Nil when none
// can use it.
func HeadFor(ws []locksv1alpha1.QueenLockWaiter, ps []locksv1alpha1.QueenLock, old *locksv1alpha1.QueenLock, now time.Time) *locksv1alpha1.QueenLockWaiter {
	lock, slot := old.Spec.Lock, int(old.Spec.Slot)
	served := map[string]bool{}
	for i := range ps {
		p := &ps[i]
		if p.Spec.Lock == lock && p.Name != old.Name && p.DeletionTimestamp.IsZero() && !permit.Expired(p, now) {
			served[p.Spec.Owner] = true
		}
	}
	line := make([]locksv1alpha1.QueenLockWaiter, 0, len(ws))
	for _, w := range ws {
		if w.Spec.Lock == lock && w.DeletionTimestamp.IsZero() && int(w.Spec.Limit) > slot && !served[w.Spec.Owner] && w.Spec.Owner != old.Spec.Owner &&
			(old.Spec.Waiter == "" || w.Name != old.Spec.Waiter) {
			line = append(line, w)
		}
	}
	if len(line) == 0 {
		return nil
	}
	SortLine(line)
	return &line[0]
}

// lineHints is what a Versions source may also tell: whether its cache
// shows a waiter of lock that could use slot. A release, an expiry or a
// pod's end reads the line (from the API server) to hand the slot over
// only then, so one nobody waits for is still one delete. A waiter the
// cache has not seen yet joined as the slot freed: it finds the slot free
// and creates it, as any waiter whose lock is free does.
type lineHints interface {
	MayWaitFor(ns, lock string, slot int) bool
}

func (l *Client) mayHandOver(ns, lock string, slot int) bool {
	if h, ok := l.versions.(lineHints); ok {
		return h.MayWaitFor(ns, lock, slot)
	}
	return l.c != nil && waitsFor(l.c, ns, lock, slot, metav1.ListOptions{ResourceVersion: "0"}, 2*time.Second)
}

// waitsFor tells whether r lists a waiter of lock whose limit reaches
// slot. A Client with no cache of the line (a handle's or the CLI's
// straight over the Kubernetes API) asks kube-apiserver's watch cache
// (resourceVersion "0": answered at once, not waiting for the cache to be
// confirmed current), so that its release hands the slot over as the
// manager's does, rather than leaving it free for a plain acquire to take
// ahead of the line. Like the manager's cache, it may miss a waiter that
// joined as the slot freed; that waiter finds the slot free. A caller
// without the right to list waiters releases as before: by a delete.
func waitsFor(r client.Reader, ns, lock string, slot int, raw metav1.ListOptions, within time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var list locksv1alpha1.QueenLockWaiterList
	opts := []client.ListOption{client.InNamespace(ns), client.MatchingLabels{permit.LockLabel: permit.LabelValue(lock)}}
	if raw.ResourceVersion != "" {
		opts = append(opts, &client.ListOptions{Raw: &raw})
	}
	if err := r.List(ctx, &list, opts...); err != nil {
		return false // no line to read: release as before the handover
	}
	for i := range list.Items {
		if w := &list.Items[i]; w.Spec.Lock == lock && int(w.Spec.Limit) > slot && w.DeletionTimestamp.IsZero() {
			return true
		}
	}
	return false
}

// MayWaitFor tells whether the cache shows a waiter of lock whose limit
// reaches slot.
func (c cachedVersions) MayWaitFor(ns, lock string, slot int) bool {
	// A cache that is not synced yet would block the release: 100 ms,
	// then release as before the handover.
	return waitsFor(c.r, ns, lock, slot, metav1.ListOptions{}, 100*time.Millisecond)
}

// HandOver gives permit old (the version whose holding ends) to the head
// of its lock's line that can use its slot, read from the API server. It
// answers the permit as handed, or nil with nothing written when no waiter
// can use the slot. The fence of the slot's bound objects is raised first
// (WithFence), to old's token plus one, so that no write of the ending
// holding lands once the next holder may have learnt it holds the slot;
// without a fence here, the permit webhook raises it before it admits the
// update. An error of the API server is returned as it is: a Conflict or
// NotFound says old is no longer the current version.
func (l *Client) HandOver(ctx context.Context, old *locksv1alpha1.QueenLock) (*locksv1alpha1.QueenLock, error) {
	ns, lock, slot := old.Namespace, old.Spec.Lock, int(old.Spec.Slot)
	// Two slots of a semaphore that free at once would each find the same
	// head, which the other's handover has not reached yet, and hand it
	// both: one at a time, each reads the permits after the last landed
	// and passes over a waiter whose owner now holds one. Handovers from
	// another replica can still cross this one; the waiter's carrier
	// gives back all but one (giveBackOthers).
	unlock := l.handing.lock(ns + "/" + lock)
	defer unlock()
	ws, err := l.Line(ctx, ns, lock)
	if noLine(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if HeadFor(ws, nil, old, l.clock.Now()) == nil {
		return nil, nil // nobody waits for this slot: no read of the permits
	}
	bySlot, err := l.list(ctx, ns, lock)
	if err != nil {
		return nil, err
	}
	ps := make([]locksv1alpha1.QueenLock, 0, len(bySlot))
	for _, p := range bySlot {
		ps = append(ps, *p)
	}
	head := HeadFor(ws, ps, old, l.clock.Now())
	if head == nil {
		return nil, nil
	}
	// Sent unstamped (acquireTime cleared), even by the manager: the permit
	// webhook stamps it, and judges it against the line unless it comes
	// from the manager's own identity. A manager that writes under another
	// identity than the webhook knows (a route of the test control plane,
	// say) is then judged like any client rather than refused, as a
	// stamped acquire of its would be. It costs the handover one call of
	// the webhook, and only a slot that someone waits for is handed over.
	p := permit.Handed(old, head)
	if l.fence != nil {
		tok, err := permit.Token(old.ResourceVersion)
		if err != nil {
			return nil, err
		}
		if _, err := l.fence.Raise(ctx, ns, lock, slot, tok+1); err != nil {
			return nil, fmt.Errorf("handing permit %d of lock %q to waiter %s: %w", slot, lock, head.Name, err)
		}
	}
	if err := l.c.Update(ctx, p); err != nil {
		if isLostRace(err) {
			// The webhook judged it against a newer version: old is gone.
			return nil, apierrors.NewConflict(queenlocks.GroupResource(), old.Name, err)
		}
		return nil, fmt.Errorf("handing permit %d of lock %q to waiter %s: %w", slot, lock, head.Name, err)
	}
	l.answered.forget(ns, old.Name)
	return p, nil
}

// End ends the holding of permit version p, as an expiry or the end of
// its holder's pod does: it hands the permit to the head of the line when
// the Client's cache shows anyone waiting for the slot (HandOver), and
// otherwise deletes that version. It answers the permit as handed, or nil
// when it deleted it. A Conflict or NotFound says p was no longer current.
func (l *Client) End(ctx context.Context, p *locksv1alpha1.QueenLock) (*locksv1alpha1.QueenLock, error) {
	if l.mayHandOver(p.Namespace, p.Spec.Lock, int(p.Spec.Slot)) {
		got, err := l.HandOver(ctx, p)
		if err != nil || got != nil {
			return got, err
		}
	}
	rv := p.ResourceVersion
	uid := p.UID
	return nil, l.delete(ctx, p.Namespace, p.Name, metav1.Preconditions{UID: &uid, ResourceVersion: &rv})
}

// handed tells whether p was handed to a waiter and its holding has not
// been renewed since: an acquire of its owner that finds it answers it as
// won (not already), renewed first to the lifetime the acquire asks.
func handed(p *locksv1alpha1.QueenLock) bool {
	return p.Spec.Waiter != "" && p.Spec.FirstToken == 0
}

// claim answers a permit handed to a's owner: a handover to a waiter
// that is not a gated pod's writes the waiter's own short lifetime
// (permit.HandedTTL), so the acquire renews it to its own first. The
// token answered is the renew's; the holding began at the handover's,
// the fence's floor.
func (l *Client) claim(ctx context.Context, a *acquire, p *locksv1alpha1.QueenLock) (Acquired, error) {
	h, err := holderOf(p)
	if err != nil {
		return Acquired{}, err
	}
	if a.ttl <= 0 || p.Spec.TTLSeconds == a.ttl || gatedPods(p) {
		l.remember(p)
		return Acquired{Acquired: true, Permit: h.permit(), Floor: h.Token}, nil
	}
	r, err := l.Renew(ctx, a.ns, a.lock, int(p.Spec.Slot), h.Token, a.owner, a.ttl)
	if err != nil {
		return Acquired{}, err
	}
	if !r.Renewed {
		// It expired or was released before the renew landed.
		return Acquired{Reason: ReasonContended}, nil
	}
	return Acquired{Acquired: true, Permit: r.Permit, Floor: h.Token}, nil
}

// keyedMutex is a mutex per key, dropped once nobody holds or waits for it.
type keyedMutex struct {
	mu   sync.Mutex
	keys map[string]*keyedEntry
}

type keyedEntry struct {
	sync.Mutex
	refs int
}

func newKeyedMutex() *keyedMutex { return &keyedMutex{keys: map[string]*keyedEntry{}} }

// lock locks key and answers its unlock.
func (k *keyedMutex) lock(key string) func() {
	k.mu.Lock()
	e := k.keys[key]
	if e == nil {
		e = &keyedEntry{}
		k.keys[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.Lock()
	return func() {
		e.Unlock()
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.keys, key)
		}
		k.mu.Unlock()
	}
}
