package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit/gatedpod"
)

// GatedPodsPath is where the pod webhook is served.
const GatedPodsPath = "/mutate-gated-pod"

// GatedPods checks and gates labelled pods at create. It is reached only by
// pods with the label (the configuration's objectSelector); anything else
// that reaches it is let through unchanged.
type GatedPods struct {
	Core  kubernetes.Interface
	Clock clock.PassiveClock
}

// SetupWithManager serves the webhook on the manager's webhook server.
func (a *GatedPods) SetupWithManager(mgr ctrl.Manager) {
	mgr.GetWebhookServer().Register(GatedPodsPath, &admission.Webhook{Handler: a})
}

// Handle implements admission.Handler.
func (a *GatedPods) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create || req.Kind.Kind != "Pod" || req.SubResource != "" {
		return admission.Allowed("not a pod create")
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("reading the pod: %w", err))
	}
	if !gatedpod.Labelled(&pod) {
		return admission.Allowed("not a gated pod")
	}
	if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; mirror && slices.Contains(req.UserInfo.Groups, "system:nodes") {
		// The kubelet creates a static pod's mirror after the pod runs:
		// there is nothing to hold back. From anyone but a node, the
		// annotation is only a claim, and the pod is checked like any.
		return admission.Allowed("a mirror pod is never gated")
	}
	ns := req.Namespace
	if ns == "" {
		ns = pod.Namespace
	}
	if _, err := gatedpod.ParseAsk(pod.Annotations); err != nil {
		return admission.Denied(err.Error())
	}
	if pod.Spec.NodeName != "" {
		return admission.Denied(fmt.Sprintf("a pod labelled %s=%q must not set spec.nodeName (%q): the API server refuses scheduling gates on a pod already bound to a node, so it could not wait for its lock", gatedpod.Label, gatedpod.LabelValue, pod.Spec.NodeName))
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	// The refusal names every right holding takes, not the one missing:
	// the pod's creator needs no more to fix it, and a review sent
	// straight to the webhook port (which can name any ServiceAccount)
	// learns only whether it may hold locks.
	if missing, err := gatedpod.Entitled(ctx, a.Core, ns, sa); err != nil {
		return unavailable(ctx, "the rights of the pod's ServiceAccount", err)
	} else if missing != "" {
		return admission.Denied(fmt.Sprintf("ServiceAccount %q of namespace %q may not hold locks there (create, update and delete on queenlocks.%s); bind it to the queen-locks-holder ClusterRole in that namespace", sa, ns, locksv1alpha1.GroupVersion.Group))
	}
	if !gatedpod.Gated(&pod) {
		pod.Spec.SchedulingGates = append(pod.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: gatedpod.Gate})
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[gatedpod.QueuedAt] = a.Clock.Now().UTC().Format(gatedpod.TimeFormat)
	// The manager's own annotations are never the creator's to set: a pod
	// created with a token would look admitted.
	delete(pod.Annotations, gatedpod.TokenAnnotation)
	delete(pod.Annotations, gatedpod.SlotAnnotation)
	delete(pod.Annotations, gatedpod.AdmittedAt)
	patched, err := json.Marshal(&pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, patched)
}
