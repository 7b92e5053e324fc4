package locks

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// Renew extends the caller's permit by ttlSeconds (0 keeps its lifetime)
// and answers the new token. It is one merge patch conditional on the
// token; the webhook refuses it when the owner differs or the permit has
// expired. For the manager (AsManager) it is one update conditional on the
// token, stamped and checked here by the webhook's rules. When the token is stale it reads the permit once: a token that
// is stale only because the same owner's earlier renew landed is carried
// through to the current one.
func (l *Client) Renew(ctx context.Context, ns, lock string, slot int, token uint64, owner string, ttlSeconds int64) (Renewed, error) {
	name := permit.Name(lock, slot)
	rv := strconv.FormatUint(token, 10)
	var old *locksv1alpha1.QueenLock // version rv, once read
	for try := 0; try < l.tries; try++ {
		var p *locksv1alpha1.QueenLock
		var err error
		if l.stamps {
			p, err = l.stampRenew(ctx, ns, lock, name, rv, old, owner, ttlSeconds)
		} else {
			p, err = l.patchRenew(ctx, ns, name, rv, owner, ttlSeconds)
		}
		switch {
		case err == nil:
			// Another lock's permit under a hashed name cannot be ours. A
			// permit being deleted is released: the webhook passes a write
			// to it unstamped, and a renew that changed nothing would
			// otherwise answer renewed with the old lifetime.
			if p.Spec.Lock != lock || !p.DeletionTimestamp.IsZero() || gatedPods(p) {
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
			rv, old = cur.ResourceVersion, cur
		default:
			return Renewed{}, fmt.Errorf("renewing permit %d of lock %q: %w", slot, lock, err)
		}
	}
	return Renewed{Reason: ReasonLost}, nil
}

// stampRenew writes, for the manager (AsManager), a renew of version rv
// stamped here: old is that version when already read, else it is looked
// up. It answers the version unwritten when it is another lock's or being
// deleted (Renew answers lost for both), and a Refusal the webhook would
// have answered when the owner differs or the permit expired.
func (l *Client) stampRenew(ctx context.Context, ns, lock, name, rv string, old *locksv1alpha1.QueenLock, owner string, ttl int64) (*locksv1alpha1.QueenLock, error) {
	if old == nil {
		var err error
		if old, err = l.versionAt(ctx, ns, name, rv); err != nil {
			return nil, err
		}
	}
	if old.Spec.Lock != lock || !old.DeletionTimestamp.IsZero() || gatedPods(old) {
		return old, nil
	}
	p := old.DeepCopy()
	if owner != "" {
		p.Spec.Owner = owner
	}
	if ttl > 0 {
		p.Spec.TTLSeconds = ttl
	}
	if err := l.stampOver(old, p); err != nil {
		return nil, err
	}
	return p, l.c.Update(ctx, p)
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

// gatedPods tells whether a permit is a gated pod's. Nobody renews it: its
// token is the pod's for the pod's whole life, and its lifetime is the
// pod's ttl. The permit webhook refuses such a renew to any caller but the
// manager; the manager, renewing for a route caller who sent the token
// alone, refuses it here.
func gatedPods(p *locksv1alpha1.QueenLock) bool {
	return strings.HasPrefix(p.Spec.Owner, permit.GateOwnerPrefix)
}
