package locks

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
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
