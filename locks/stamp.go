package locks

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// AsManager tells the Client that it writes with the manager's own
// identity, the one whose writes the webhook configuration lets past the
// permit webhook (the chart's matchConditions: a write stamped by the
// webhook's own rules, from the clock of the process the webhook runs in,
// needs no second check; the CRD's CEL rules still check it). It then
// stamps its creates, renews and takeovers itself: permit.Stamp, the rules
// the webhook runs, from the clock the webhook in the same process reads.
// A create is refused if the name is taken, an update is conditional on
// the version it was stamped over, so the API server stores exactly what
// Stamp decided or nothing, and the CRD's CEL rules check the transition
// as they check every write. Where the webhook still sees the write (a
// configuration without the skip, the manager under another identity than
// the configuration names, a create whose managedFields no admission
// policy removed) it takes it as the same transition (a takeover from the
// manager may come with its new acquireTime set rather than cleared) and
// stamps it again by the same rules, so the writes are valid either way.
func AsManager() Option { return func(l *Client) { l.stamps = true } }

// stampOver decides the write of obj over old as the webhook would, at the
// Client's clock, for the manager. A refusal with a reason (held, lost) is
// a race the caller lost; see isLostRace.
func (l *Client) stampOver(old, obj *locksv1alpha1.QueenLock) error {
	_, err := permit.Stamp(old, obj, l.clock.Now(), l.grace, permit.Caller{Manager: true})
	return err
}

// exactVersions is a source of whole permits by exact version: the
// manager's informer (CachedVersions) is one.
type exactVersions interface {
	Exact(ns, name, resourceVersion string) (*locksv1alpha1.QueenLock, bool)
}

// versionAt answers permit name in ns at version rv, whole: from the
// Client's source of versions when it has exactly that one, or else read
// from the API server. A version never changes, so a cached copy of it is
// as good as a read; a write conditional on rv then proves it current. It
// answers a Conflict when the permit has moved on from rv, and NotFound
// when it is gone.
func (l *Client) versionAt(ctx context.Context, ns, name, rv string) (*locksv1alpha1.QueenLock, error) {
	if ev, ok := l.versions.(exactVersions); ok {
		if p, ok := ev.Exact(ns, name, rv); ok {
			return p, nil
		}
	}
	p := &locksv1alpha1.QueenLock{}
	if err := l.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p); err != nil {
		return nil, err
	}
	if p.ResourceVersion != rv {
		return nil, apierrors.NewConflict(schema.GroupResource{Group: locksv1alpha1.GroupVersion.Group, Resource: "queenlocks"}, name,
			fmt.Errorf("the permit is at version %s, not %s", p.ResourceVersion, rv))
	}
	return p, nil
}
