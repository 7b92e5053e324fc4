package gatedpod

import (
	"context"
	"errors"
	"sync"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/kubernetes"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

// holderVerbs are the rights on queenlocks a pod's ServiceAccount needs to
// hold a lock: the same as a holder through the route (create and update to
// acquire, delete to release), so that a gated pod can never take what its
// own identity could not.
var holderVerbs = []string{"create", "update", "delete"}

// Entitled asks the API server whether ServiceAccount sa of namespace ns
// may hold locks in ns, and names the first verb it may not; "" when it may.
func Entitled(ctx context.Context, core kubernetes.Interface, ns, sa string) (missing string, err error) {
	// One review per verb, sent together: they sit between a slot freeing
	// and the next pod's admission, so they cost one round trip, not three.
	allowed := make([]bool, len(holderVerbs))
	errs := make([]error, len(holderVerbs))
	var wg sync.WaitGroup
	for i, verb := range holderVerbs {
		wg.Go(func() {
			review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: serviceaccount.MakeUsername(ns, sa),
				// A ServiceAccount's requests carry its groups: a RoleBinding
				// to system:serviceaccounts:<ns> grants it as much as one to
				// the ServiceAccount itself.
				Groups: append(serviceaccount.MakeGroupNames(ns), "system:authenticated"),
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Namespace: ns,
					Verb:      verb,
					Group:     locksv1alpha1.GroupVersion.Group,
					Resource:  "queenlocks",
				},
			}}
			got, err := core.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
			errs[i], allowed[i] = err, err == nil && got.Status.Allowed
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	for i, verb := range holderVerbs {
		if !allowed[i] {
			return verb, nil
		}
	}
	return "", nil
}
