package charts

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// The permit webhook lets through the manager's own stamped writes by the
// same matchConditions as the kustomize install
// (config/default/webhook_manager_writes.yaml, which the test control
// plane applies), naming the chart's own ServiceAccount: a different rule
// here would be a rule no test runs.
func TestPermitWebhookSkipsTheManagersStampedWrites(t *testing.T) {
	objs := renderAs(t)
	get(t, objs, "ServiceAccount/x-queen-locks")
	var got any
	for _, w := range field(t, get(t, objs, "MutatingWebhookConfiguration/x-queen-locks"), "webhooks").([]any) {
		if wm := w.(map[string]any); wm["name"] == "mqueenlock.locks.queen.dev" {
			got = wm["matchConditions"]
		}
	}
	if got == nil {
		t.Fatal("the permit webhook has no matchConditions")
	}
	var patch []struct {
		Path  string `json:"path"`
		Value any    `json:"value"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, "config/default/webhook_manager_writes.yaml")), &patch); err != nil || len(patch) != 1 {
		t.Fatalf("config/default/webhook_manager_writes.yaml: %v (%d operations)", err, len(patch))
	}
	want := jsonOf(t, patch[0].Value)
	want = strings.ReplaceAll(want, "system:serviceaccount:queen-locks:queen-locks-controller-manager", "system:serviceaccount:team:x-queen-locks")
	if d := cmp.Diff(want, jsonOf(t, got)); d != "" {
		t.Errorf("the chart's matchConditions differ from config/default's (-config +chart):\n%s", d)
	}
}

// The admission policy that lets the manager's creates skip the permit
// webhook is config/default's (which the test control plane installs),
// naming the chart's ServiceAccount; the chart installs it only where the
// cluster serves MutatingAdmissionPolicy v1, and without it the webhook's
// matchConditions send those creates to the webhook.
func TestManagerCreatesPolicyIsConfigDefaults(t *testing.T) {
	if objs := renderAs(t); hasKind(objs, "MutatingAdmissionPolicy") || hasKind(objs, "MutatingAdmissionPolicyBinding") {
		t.Fatal("the chart rendered a MutatingAdmissionPolicy for a cluster that does not serve them")
	}
	objs := objects(t, run(t, helm, "template", "x", chart, "--namespace", "team",
		"--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"))
	policy := get(t, objs, "MutatingAdmissionPolicy/x-queen-locks-manager-creates")
	binding := get(t, objs, "MutatingAdmissionPolicyBinding/x-queen-locks-manager-creates")
	if got := field(t, binding, "spec", "policyName"); got != policy.GetName() {
		t.Errorf("the binding names policy %v, want %s", got, policy.GetName())
	}
	docs := strings.Split(readFile(t, "config/default/manager_creates.yaml"), "\n---")
	var want map[string]any
	if err := yaml.Unmarshal([]byte(docs[0]), &want); err != nil {
		t.Fatal(err)
	}
	wantSpec := strings.ReplaceAll(jsonOf(t, want["spec"]), "system:serviceaccount:queen-locks:queen-locks-controller-manager", "system:serviceaccount:team:x-queen-locks")
	if d := cmp.Diff(wantSpec, jsonOf(t, policy.Object["spec"])); d != "" {
		t.Errorf("the chart's policy differs from config/default's (-config +chart):\n%s", d)
	}
}

func hasKind(objs map[string]*unstructured.Unstructured, kind string) bool {
	for _, o := range objs {
		if o.GetKind() == kind {
			return true
		}
	}
	return false
}

// config/kube-1.35 is config/default without the policy, which an API
// server before 1.36 does not serve: every other object the same.
func TestKube135ConfigIsDefaultWithoutThePolicy(t *testing.T) {
	kubectl := filepath.Join(root, "bin", "kubectl")
	base := objects(t, run(t, kubectl, "kustomize", filepath.Join(root, "config", "default")))
	old := objects(t, run(t, kubectl, "kustomize", filepath.Join(root, "config", "kube-1.35")))
	for _, key := range []string{"MutatingAdmissionPolicy/queen-locks-manager-creates", "MutatingAdmissionPolicyBinding/queen-locks-manager-creates"} {
		get(t, base, key)
		if _, ok := old[key]; ok {
			t.Errorf("config/kube-1.35 has %s", key)
		}
		delete(base, key)
	}
	if len(old) != len(base) {
		t.Errorf("config/kube-1.35 has %d objects, config/default %d besides the policy", len(old), len(base))
	}
	for key, want := range base {
		if d := cmp.Diff(want.Object, get(t, old, key).Object); d != "" {
			t.Errorf("%s differs (-default +kube-1.35):\n%s", key, d)
		}
	}
}
