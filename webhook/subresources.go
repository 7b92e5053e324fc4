package webhook

import (
	"context"
	"fmt"
	"net/http"
	"slices"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/queen-locks/queen-locks/permit"
)

// GuardSubresourcePath is where writes to the status and scale
// subresources of the guarded kinds are sent.
const GuardSubresourcePath = "/validate-guarded-subresource"

// Subresources refuses writes to the status and scale subresources of a
// guarded object. Neither can carry a guard: a status write's metadata is
// reset to the stored object's by the API server, and a scale write sends
// an autoscaling Scale, which has no labels or annotations at all (so an
// objectSelector never matches it either, and the webhook for scale is
// registered without one). Left alone, kubectl scale by a replaced holder
// would change a guarded Deployment. The holder writes the object itself
// (spec.replicas, say) under its guard instead.
type Subresources struct {
	// Meta reads the parent object of a scale write, whose labels the
	// request does not carry.
	Meta metadata.Interface
	// Guarded are the kinds the guard webhooks are configured for
	// (--guarded-resources). A scale write of any other kind is refused
	// without a read: the API server never sends one, and a review sent
	// straight to the webhook port must not make the manager read (and
	// tell the existence of) an object no guard needs, a Secret or a pod.
	Guarded []schema.GroupResource
}

// SetupWithManager registers the webhook on the manager's webhook server.
func (s *Subresources) SetupWithManager(mgr ctrl.Manager) error {
	if s.Meta == nil {
		m, err := metadata.NewForConfig(mgr.GetConfig())
		if err != nil {
			return fmt.Errorf("creating the metadata client: %w", err)
		}
		s.Meta = m
	}
	mgr.GetWebhookServer().Register(GuardSubresourcePath, &admission.Webhook{Handler: s})
	return nil
}

// Handle decides one subresource write.
func (s *Subresources) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Update && req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	var parent metav1.ObjectMeta
	switch req.SubResource {
	case "status":
		// The object of a status write is the whole object, labels and all.
		meta, old, err := metas(req)
		if err != nil {
			return admission.Errored(http.StatusBadRequest, err)
		}
		parent = old
		if isGuarded(meta) {
			parent = meta
		}
	case "scale":
		gvr := schema.GroupVersionResource{Group: req.Resource.Group, Version: req.Resource.Version, Resource: req.Resource.Resource}
		// ConfigMaps and Secrets have no scale subresource: a review that
		// says otherwise is forged, and is answered without a read.
		if gvr.Group == "" && (gvr.Resource == "configmaps" || gvr.Resource == "secrets") {
			return admission.Denied(fmt.Sprintf("%s have no scale subresource", gvr.Resource))
		}
		if !slices.Contains(s.Guarded, gvr.GroupResource()) {
			return admission.Denied(fmt.Sprintf("scale writes of %s are sent to the guard webhook, but the manager does not guard that kind: name it in --guarded-resources (the chart's guard.rules) or take it out of the webhook configuration", gvr.GroupResource()))
		}
		m, err := s.Meta.Resource(gvr).Namespace(req.Namespace).Get(ctx, req.Name, metav1.GetOptions{})
		if err != nil {
			return unavailable(ctx, "the object whose scale is written", err)
		}
		parent = m.ObjectMeta
	default:
		return admission.Allowed("")
	}
	if !isGuarded(parent) {
		return admission.Allowed("")
	}
	why := fmt.Sprintf("the %s subresource of a guarded object cannot carry a guard, so it is not written: write the object itself under its guard", req.SubResource)
	// Name the lock, never the record's token: it may be a later holder's.
	if rec, bound, err := permit.ParseFence(parent.Annotations[permit.FenceAnnotation]); err == nil && bound {
		why = fmt.Sprintf("lock %q: %s", rec.Lock, why)
	}
	return guardDenied("", why)
}
