package election

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/guard"
	"github.com/queen-locks/queen-locks/permit"
)

// Client wraps c so that every write to a guarded object carries the guard
// of this Lock's current token, read as the write is sent (package guard).
// A write refused because the holder's own renew moved the token is sent
// again with the new one. A write refused because the leadership is gone
// (taken over, expired, released) makes the client refuse every later
// write at once, unsent, with guard.ErrLost, and the Lock lost: its next
// Get or Update fails, and client-go's OnStoppedLeading follows within
// RenewDeadline.
//
// Use it as controller-runtime's Options.NewClient, so that
// mgr.GetClient() is the fenced client (docs/leader-election.md). Guarded
// objects must live in the Lock's namespace: the webhook judges a guard by
// the permit in the object's own namespace, and the client refuses, unsent,
// a guarded write elsewhere.
func (l *Lock) Client(c client.Client) client.Client {
	return guard.NewClient(c, l, l.guardOpts...)
}

// Current is the fence of the Lock's holding now; ok is false while it
// holds nothing (not yet elected, released, lost) and once its lease is
// over on this machine's clock without a renew getting through: a leader
// paused or cut off past its lease does not even send its writes.
func (l *Lock) Current() (guard.Fence, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := guard.Fence{Namespace: l.ns, Lock: l.name, Slot: Slot, Token: l.token}
	return f, l.liveLocked()
}

// Refresh reads the permit after a write under refused was refused: the
// holding is still ours when the owner and acquireTime are this Lock's and
// it has not expired by the Lock's clock; the token is then the permit's
// (a renew of ours may have moved it). When the permit cannot be read (the
// Lock's own connection is cut, say), a holding whose lease is over on
// this machine's clock is gone all the same.
func (l *Lock) Refresh(ctx context.Context, refused guard.Fence) (guard.Fence, bool, error) {
	l.mu.Lock()
	holding, lost, live := l.holding, l.lost, l.liveLocked()
	l.mu.Unlock()
	if holding == nil || lost != nil {
		return guard.Fence{}, false, nil
	}
	p := &locksv1alpha1.QueenLock{}
	err := l.c.Get(ctx, client.ObjectKey{Namespace: l.ns, Name: l.permitName}, p)
	switch {
	case apierrors.IsNotFound(err):
		return guard.Fence{}, false, nil
	case err != nil && !live:
		return guard.Fence{}, false, nil
	case err != nil:
		return guard.Fence{}, false, err
	}
	tok, err := permit.Token(p.ResourceVersion)
	if err != nil {
		return guard.Fence{}, false, err
	}
	if p.Spec.Owner != l.identity || !p.Spec.AcquireTime.Equal(holding) || p.DeletionTimestamp != nil ||
		permit.Expired(p, l.clock.Now()) {
		return guard.Fence{}, false, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.holding.Equal(holding) && tok > l.token {
		l.token = tok
	}
	f := refused
	f.Token = tok
	return f, true, nil
}

// Lose ends the leadership for good: a write under it was refused and the
// permit is no longer this Lock's.
func (l *Lock) Lose(reason string) {
	l.lose(fmt.Errorf("a write under its guard was refused (reason %s)", reason))
}
