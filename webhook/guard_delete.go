package webhook

import (
	"context"
	"fmt"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// validateDelete admits the delete of a guarded object when its namespace
// is being deleted, when an administrator with the override right sends
// it, or while the holder that marked it deletable still holds the lock
// with the token of its last write.
func (g *Guard) validateDelete(ctx context.Context, req admission.Request, old metav1.ObjectMeta) admission.Response {
	if !isGuarded(old) {
		return admission.Allowed("")
	}
	var ns corev1.Namespace
	err := g.Reader.Get(ctx, client.ObjectKey{Name: req.Namespace}, &ns)
	switch {
	case err == nil && (ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating):
		return admission.Allowed("the namespace is being deleted")
	case err != nil && !apierrors.IsNotFound(err):
		return unavailable(ctx, "the namespace", err)
	}
	if allowed, err := g.mayOverride(ctx, req); err != nil {
		return unavailable(ctx, "the override right", err)
	} else if allowed {
		return admission.Allowed("administrator override")
	}
	howTo := fmt.Sprintf(`to delete a guarded object, write it once under the current guard with the annotation %s: "true", then delete it while that token is current`, permit.DeletableAnnotation)
	raw := old.Annotations[permit.FenceAnnotation]
	rec, bound, err := permit.ParseFence(raw)
	if err != nil || !bound {
		return guardDenied("", fmt.Sprintf("this object has no record of a lock; %s", howTo))
	}
	// The record's token may be the holder's: refusals name the lock only.
	if old.Annotations[permit.DeletableAnnotation] != fmt.Sprint(rec.Token) {
		return guardDenied("", fmt.Sprintf("lock %q: the object's last write did not mark it deletable; %s", rec.Lock, howTo))
	}
	if _, ok := g.current(ctx, req.Namespace, rec.String(), rec); !ok {
		return guardDenied("", fmt.Sprintf("lock %q slot %d is no longer held by the holder whose last write marked this object deletable; %s", rec.Lock, rec.Slot, howTo))
	}
	return admission.Allowed("")
}

// override answers whether the request's user may use the override; when
// not, resp is the refusal.
func (g *Guard) override(ctx context.Context, req admission.Request) (resp admission.Response, ok bool) {
	allowed, err := g.mayOverride(ctx, req)
	switch {
	case err != nil:
		return unavailable(ctx, "the override right", err), false
	case !allowed:
		return guardDenied("", fmt.Sprintf("annotation %s: user %q may not %s %s.%s in namespace %s",
			permit.OverrideAnnotation, req.UserInfo.Username, OverrideVerb, OverrideResource, locksv1alpha1.GroupVersion.Group, req.Namespace)), false
	}
	return admission.Response{}, true
}

func (g *Guard) mayOverride(ctx context.Context, req admission.Request) (bool, error) {
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range req.UserInfo.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: req.UserInfo.Username, Groups: req.UserInfo.Groups, UID: req.UserInfo.UID, Extra: extra,
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: req.Namespace, Verb: OverrideVerb,
			Group: locksv1alpha1.GroupVersion.Group, Resource: OverrideResource,
		},
	}}
	if err := g.Client.Create(ctx, sar); err != nil {
		return false, fmt.Errorf("asking whether %q may override the guard: %w", req.UserInfo.Username, err)
	}
	return sar.Status.Allowed, nil
}
