package locks

import (
	"context"
	"fmt"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/queen-locks/queen-locks/permit"
)

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

// GiveBack deletes the permit of lock slot if it is still at version token,
// the one an acquire won: never a later version, not even of the same
// owner, which Release would carry a stale token through to. It undoes an
// acquire whose answer nobody received; once anyone has renewed the permit,
// it is somebody's, and stays. It answers whether it deleted.
func (l *Client) GiveBack(ctx context.Context, ns, lock string, slot int, token uint64) (bool, error) {
	name := permit.Name(lock, slot)
	rv := strconv.FormatUint(token, 10)
	err := l.delete(ctx, ns, name, metav1.Preconditions{ResourceVersion: &rv})
	switch {
	case err == nil:
		l.answered.forget(ns, name)
		return true, nil
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return false, nil
	default:
		return false, fmt.Errorf("giving back permit %d of lock %q: %w", slot, lock, err)
	}
}
