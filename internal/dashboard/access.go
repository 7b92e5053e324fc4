package dashboard

import (
	"context"
	"maps"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

// How often what the caller may release is asked again: RBAC changes
// while a page is open.
const accessRefresh = 30 * time.Second

// namesPerNamespace bounds the reviews of single permits in a namespace
// where the caller may not delete every permit: RBAC can grant the delete
// of named permits only, but a namespace of thousands must not cost
// thousands of reviews every refresh. Past it, those rows show no button
// (the API server would still decide a release).
const namesPerNamespace = 256

// watchAccess keeps the page told where a release button belongs: a
// SelfSubjectAccessReview of delete on permits, per namespace, and per
// permit in a namespace where the namespace-wide review said no.
func (s *Server) watchAccess(ctx context.Context) {
	type answer struct {
		ok   bool
		when time.Time
	}
	cache := map[authorizationv1.ResourceAttributes]answer{}
	may := func(ns, name string) bool {
		ra := authorizationv1.ResourceAttributes{Namespace: ns, Name: name, Verb: "delete",
			Group: locksv1alpha1.GroupVersion.Group, Resource: "queenlocks"}
		if a, ok := cache[ra]; ok && time.Since(a.when) < accessRefresh {
			return a.ok
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		rev, err := s.clients.kube.AuthorizationV1().SelfSubjectAccessReviews().Create(rctx,
			&authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &ra}},
			metav1.CreateOptions{})
		ok := err == nil && rev.Status.Allowed
		if err == nil || ctx.Err() == nil {
			cache[ra] = answer{ok: ok, when: time.Now()}
		}
		return ok
	}
	tick := time.NewTicker(accessRefresh)
	defer tick.Stop()
	var last access
	for {
		for k, a := range cache {
			if time.Since(a.when) >= accessRefresh {
				delete(cache, k)
			}
		}
		keys := s.hub.permitKeys()
		if s.hub.scope != "" {
			if _, ok := keys[s.hub.scope]; !ok {
				keys[s.hub.scope] = nil
			}
		}
		a := access{Checked: true, Namespaces: map[string]bool{}, Permits: map[string]bool{}}
		for ns, names := range keys {
			if may(ns, "") {
				a.Namespaces[ns] = true
				continue
			}
			for i, name := range names {
				if i == namesPerNamespace {
					break
				}
				if may(ns, name) {
					a.Permits[ns+"/"+name] = true
				}
			}
		}
		if ctx.Err() != nil {
			return
		}
		if last.Namespaces == nil || !maps.Equal(a.Namespaces, last.Namespaces) || !maps.Equal(a.Permits, last.Permits) {
			s.hub.setAccess(a)
			last = a
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-s.hub.kick:
		}
	}
}
