package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"gomodules.xyz/jsonpatch/v2"
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
	if err := gatedpod.CheckUnknown(pod.Annotations); err != nil {
		return admission.Denied(err.Error())
	}
	if n := len(pod.Annotations); n > gatedpod.MaxAnnotations {
		return admission.Denied(fmt.Sprintf("a pod labelled %s=%q may carry at most %d annotations, this one has %d: the manager's admission policy compares them when it lets the pod in, and CEL bounds what that may cost", gatedpod.Label, gatedpod.LabelValue, gatedpod.MaxAnnotations, n))
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
	return admission.Patched("gated", gatePatch(&pod, a.Clock.Now())...)
}

// gatePatch is the JSON patch that gates pod: the scheduling gate, the
// queued-at stamp, and none of the manager's own annotations, which are
// never the creator's to set (a pod created with a token would look
// admitted). It names only what it changes: the pod was decoded with this
// build's types, and a patch computed from re-encoding it would drop every
// field a newer API server has that they do not know.
func gatePatch(pod *corev1.Pod, now time.Time) []jsonpatch.JsonPatchOperation {
	var ops []jsonpatch.JsonPatchOperation
	add := func(path string, v any) {
		ops = append(ops, jsonpatch.JsonPatchOperation{Operation: "add", Path: path, Value: v})
	}
	gate := corev1.PodSchedulingGate{Name: gatedpod.Gate}
	switch {
	case gatedpod.Gated(pod):
	case pod.Spec.SchedulingGates == nil:
		add("/spec/schedulingGates", []corev1.PodSchedulingGate{gate})
	default:
		add("/spec/schedulingGates/-", gate)
	}
	queuedAt := now.UTC().Format(gatedpod.TimeFormat)
	if pod.Annotations == nil {
		add("/metadata/annotations", map[string]string{gatedpod.QueuedAt: queuedAt})
		return ops
	}
	add(pointer("metadata", "annotations", gatedpod.QueuedAt), queuedAt)
	for _, k := range []string{gatedpod.TokenAnnotation, gatedpod.SlotAnnotation, gatedpod.AdmittedAt} {
		if _, ok := pod.Annotations[k]; ok {
			ops = append(ops, jsonpatch.JsonPatchOperation{Operation: "remove", Path: pointer("metadata", "annotations", k)})
		}
	}
	return ops
}
