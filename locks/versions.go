package locks

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

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

// CachedVersions is a Versions source over an informer cache, such as the
// manager's. The cache may be behind or ahead of the caller: it answers only
// when it holds exactly the version asked for.
func CachedVersions(r client.Reader) Versions { return cachedVersions{r} }

type cachedVersions struct{ r client.Reader }

func (c cachedVersions) Version(ns, name, rv string) (Version, bool) {
	p, ok := c.Exact(ns, name, rv)
	if !ok || p.Spec.ExpireTime == nil || !p.DeletionTimestamp.IsZero() {
		return Version{}, false
	}
	return Version{Owner: p.Spec.Owner, ExpireTime: p.Spec.ExpireTime.Time}, true
}

// Exact answers the whole permit when the cache holds exactly version rv
// of it (a copy: the caller may change it).
func (c cachedVersions) Exact(ns, name, rv string) (*locksv1alpha1.QueenLock, bool) {
	// The informer is already synced in a running manager; the timeout only
	// keeps a caller from waiting on a cache that is not.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	p := &locksv1alpha1.QueenLock{}
	if err := c.r.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p); err != nil || p.ResourceVersion != rv {
		return nil, false
	}
	return p, true
}

// HasSlotsAbove0 tells whether the cache holds a permit of lock above slot
// 0: one taken while the lock's limit was larger. A limit-1 acquire that
// wins slot 0 reads the lock's permits only then, to keep an owner to one
// slot; with none, its win stands on the create alone, the one write of a
// free lock. A higher slot taken so recently that the cache has not seen
// it is missed: only an owner racing itself with two limits at once can
// end up holding two slots that way (docs/http-api.md).
func (c cachedVersions) HasSlotsAbove0(ns, lock string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var list locksv1alpha1.QueenLockList
	if err := c.r.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{permit.LockLabel: permit.LabelValue(lock)}); err != nil {
		return true // unknown: read the lock's permits
	}
	for i := range list.Items {
		if list.Items[i].Spec.Lock == lock && list.Items[i].Spec.Slot > 0 {
			return true
		}
	}
	return false
}

// slotsAbove0 is what a Versions source may also tell: see HasSlotsAbove0.
type slotsAbove0 interface {
	HasSlotsAbove0(ns, lock string) bool
}

// mayHoldAbove0 tells whether a limit-1 acquire that won slot 0 must read
// the lock's permits: always, without a cache that says otherwise.
func (l *Client) mayHoldAbove0(ns, lock string) bool {
	if c, ok := l.versions.(slotsAbove0); ok {
		return c.HasSlotsAbove0(ns, lock)
	}
	return true
}
