package webhook

import (
	"context"
	"encoding/json"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

// The route writes with the manager's identity, which in a cluster is a
// pod-bound ServiceAccount token of the manager's own pod, and names the
// caller's pod as the holder. The manager may name any pod; any other
// pod-bound caller only itself. (Found by the end-to-end test on a real
// node: the envtest suites run the manager outside any pod.)
func TestTheManagerMayNameAnyPodOthersOnlyThemselves(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := locksv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	h := &QueenLock{Clock: clock.RealClock{}, Self: "system:serviceaccount:queen-locks:queen-locks", decoder: admission.NewDecoder(scheme)}
	p := &locksv1alpha1.QueenLock{
		TypeMeta:   metav1.TypeMeta{APIVersion: locksv1alpha1.GroupVersion.String(), Kind: "QueenLock"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "job.0"},
		Spec: locksv1alpha1.QueenLockSpec{Lock: "job", Limit: 1, Owner: "w", TTLSeconds: 30,
			HolderPod: &locksv1alpha1.PodRef{Name: "worker-x", UID: "u-worker-x"}},
	}
	raw, _ := json.Marshal(p)
	req := func(user, pod string) admission.Request {
		return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw},
			UserInfo: authenticationv1.UserInfo{Username: user, Extra: map[string]authenticationv1.ExtraValue{
				podNameExtra: {pod}, podUIDExtra: {"u-" + pod}}},
		}}
	}
	if r := h.Mutate(context.Background(), req("system:serviceaccount:queen-locks:queen-locks", "queen-locks-0")); !r.Allowed {
		t.Fatalf("the manager naming the caller's pod was refused: %v", r.Result)
	}
	if r := h.Mutate(context.Background(), req("system:serviceaccount:team-a:worker", "worker-x")); !r.Allowed {
		t.Fatalf("a pod naming itself was refused: %v", r.Result)
	}
	if r := h.Mutate(context.Background(), req("system:serviceaccount:team-a:other", "other")); r.Allowed {
		t.Fatal("a pod naming another pod was admitted")
	}
}
