package webhook_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/queen-locks/queen-locks/permit/gatedpod"
	"github.com/queen-locks/queen-locks/webhook"
)

// The pod webhook answers a patch of only what it changes: a field of the
// pod that this build's types do not know (a newer API server's) comes
// through untouched, as does everything else the pod carries.
func TestThePodWebhookPatchesOnlyWhatItChanges(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	// The pod's ServiceAccount may hold locks, as gating needs.
	for _, o := range []client.Object{
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "holder"}, Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{"locks.queen.dev"}, Resources: []string{"queenlocks"}, Verbs: []string{"create", "update", "delete"}}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "holder"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "holder"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "default"}}},
	} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	raw := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"` + ns + `",` +
		`"labels":{"locks.queen.dev/gate":"true"},` +
		`"annotations":{"locks.queen.dev/lock":"nightly","locks.queen.dev/token":"99","example.com/keep":"me"}},` +
		`"spec":{"containers":[{"name":"job","image":"job","futureContainerField":{"a":1}}],` +
		`"schedulingGates":[{"name":"example.com/other"}],"futureSpecField":"kept","hostname":"h"}}`
	wh := &webhook.GatedPods{Core: env.Clientset, Clock: clock.RealClock{}}
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Create, Namespace: ns, Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Object: runtime.RawExtension{Raw: []byte(raw)},
	}}
	var resp admission.Response
	// RBAC's informer takes a moment to see the binding.
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		resp = wh.Handle(ctx, req)
		return resp.Allowed, nil
	}); err != nil {
		t.Fatalf("refused: %v", resp.Result)
	}
	for _, op := range resp.Patches {
		if !strings.HasPrefix(op.Path, "/spec/schedulingGates") && !strings.HasPrefix(op.Path, "/metadata/annotations/locks.queen.dev~1") {
			t.Errorf("the patch touches %s %s", op.Operation, op.Path)
		}
	}
	ops, err := json.Marshal(resp.Patches)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(ops)
	if err != nil {
		t.Fatal(err)
	}
	out, err := patch.Apply([]byte(raw))
	if err != nil {
		t.Fatalf("applying %s: %v", ops, err)
	}
	var got map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	spec := got["spec"].(map[string]any)
	meta := got["metadata"].(map[string]any)
	ann := meta["annotations"].(map[string]any)
	if spec["futureSpecField"] != "kept" || spec["containers"].([]any)[0].(map[string]any)["futureContainerField"] == nil {
		t.Fatalf("fields the types do not know were dropped: %s", out)
	}
	if ann["example.com/keep"] != "me" || ann[gatedpod.QueuedAt] == nil || ann[gatedpod.TokenAnnotation] != nil {
		t.Fatalf("annotations after the patch: %v", ann)
	}
	gates, _ := json.Marshal(spec["schedulingGates"])
	if string(gates) != `[{"name":"example.com/other"},{"name":"locks.queen.dev/lock"}]` {
		t.Fatalf("scheduling gates after the patch: %s", gates)
	}

	// A pod without gates or annotations of its own gets both whole.
	bare := strings.Replace(strings.Replace(raw, `"schedulingGates":[{"name":"example.com/other"}],`, "", 1),
		`"annotations":{"locks.queen.dev/lock":"nightly","locks.queen.dev/token":"99","example.com/keep":"me"}`, `"annotations":{"locks.queen.dev/lock":"nightly"}`, 1)
	req.Object.Raw = []byte(bare)
	resp = wh.Handle(ctx, req)
	ops, _ = json.Marshal(resp.Patches)
	if patch, err = jsonpatch.DecodePatch(ops); err == nil {
		out, err = patch.Apply([]byte(bare))
	}
	var pod corev1.Pod
	if err == nil {
		err = json.Unmarshal(out, &pod)
	}
	if err != nil || !gatedpod.OnlyOurGate(&pod) || pod.Annotations[gatedpod.QueuedAt] == "" || !strings.Contains(string(out), "futureSpecField") {
		t.Fatalf("a bare pod after the patch %s: %s, %v", ops, out, err)
	}
}
