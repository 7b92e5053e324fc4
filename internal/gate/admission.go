package gate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"

	admissionv1 "k8s.io/api/admission/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

// WebhookPath is where the pod webhook is served.
const WebhookPath = "/mutate-gated-pod"

// holderVerbs are the rights on queenlocks a pod's ServiceAccount needs to
// hold a lock: the same as a holder through the route (create and update to
// acquire, delete to release), so that a gated pod can never take what its
// own identity could not.
var holderVerbs = []string{"create", "update", "delete"}

// Admission checks and gates labelled pods at create. It is reached only by
// pods with the label (the configuration's objectSelector); anything else
// that reaches it is let through unchanged.
type Admission struct {
	Core  kubernetes.Interface
	Clock clock.PassiveClock
}

// SetupWithManager serves the webhook on the manager's webhook server.
func (a *Admission) SetupWithManager(mgr ctrl.Manager) {
	mgr.GetWebhookServer().Register(WebhookPath, &admission.Webhook{Handler: a})
}

// Handle implements admission.Handler.
func (a *Admission) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create || req.Kind.Kind != "Pod" || req.SubResource != "" {
		return admission.Allowed("not a pod create")
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("reading the pod: %w", err))
	}
	if !Labelled(&pod) {
		return admission.Allowed("not a gated pod")
	}
	if _, mirror := pod.Annotations[mirrorAnnotation]; mirror && slices.Contains(req.UserInfo.Groups, "system:nodes") {
		// The kubelet creates a static pod's mirror after the pod runs:
		// there is nothing to hold back. From anyone but a node, the
		// annotation is only a claim, and the pod is checked like any.
		return admission.Allowed("a mirror pod is never gated")
	}
	ns := req.Namespace
	if ns == "" {
		ns = pod.Namespace
	}
	if _, err := ParseAsk(pod.Annotations); err != nil {
		return admission.Denied(err.Error())
	}
	if pod.Spec.NodeName != "" {
		return admission.Denied(fmt.Sprintf("a pod labelled %s=%q must not set spec.nodeName (%q): the API server refuses scheduling gates on a pod already bound to a node, so it could not wait for its lock", Label, LabelValue, pod.Spec.NodeName))
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	if missing, err := Entitled(ctx, a.Core, ns, sa); err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("checking whether ServiceAccount %s/%s may hold locks: %w", ns, sa, err))
	} else if missing != "" {
		return admission.Denied(fmt.Sprintf("ServiceAccount %q of namespace %q may not %s queenlocks.%s in %q, which holding a lock takes; bind it to the queen-locks-holder ClusterRole in that namespace", sa, ns, missing, locksv1alpha1.GroupVersion.Group, ns))
	}
	if !Gated(&pod) {
		pod.Spec.SchedulingGates = append(pod.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: Gate})
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[QueuedAt] = a.Clock.Now().UTC().Format(TimeFormat)
	// The manager's own annotations are never the creator's to set: a pod
	// created with a token would look admitted.
	delete(pod.Annotations, TokenAnnotation)
	delete(pod.Annotations, SlotAnnotation)
	delete(pod.Annotations, AdmittedAt)
	patched, err := json.Marshal(&pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, patched)
}

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
