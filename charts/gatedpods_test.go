package charts

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// renderAs renders the chart as release x in namespace team, so anything
// that still says the base's queen-locks namespace or names stands out.
func renderAs(t *testing.T, sets ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	args := []string{"template", "x", chart, "--namespace", "team"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return objects(t, run(t, helm, args...))
}

func managerArgs(t *testing.T, objs map[string]*unstructured.Unstructured, dep string) []string {
	t.Helper()
	c := field(t, get(t, objs, "Deployment/"+dep), "spec", "template", "spec", "containers").([]any)[0].(map[string]any)
	return toStrings(c["args"])
}

func gatedWebhook(t *testing.T, objs map[string]*unstructured.Unstructured) map[string]any {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != "MutatingWebhookConfiguration" {
			continue
		}
		for _, w := range field(t, o, "webhooks").([]any) {
			if wm := w.(map[string]any); wm["name"] == "mgatedpod.locks.queen.dev" {
				return wm
			}
		}
	}
	return nil
}

// Gated pods are opt-in: by default the chart sends no pod to any webhook,
// installs no pod policy and gives the manager no right to change pods.
func TestGatedPodsOffByDefault(t *testing.T) {
	objs := render(t)
	for key := range objs {
		if strings.Contains(key, "gated") {
			t.Errorf("%s rendered with gatedPods.enabled=false", key)
		}
	}
	if w := gatedWebhook(t, objs); w != nil {
		t.Error("the gated pods' webhook is rendered with gatedPods.enabled=false")
	}
	for _, a := range managerArgs(t, objs, "queen-locks") {
		if a == "--gated-pods" {
			t.Error("the manager runs with --gated-pods by default")
		}
	}
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" {
			continue
		}
		rules, _ := o.Object["rules"].([]any)
		for _, r := range rules {
			rm := r.(map[string]any)
			res, _ := rm["resources"].([]any)
			verbs, _ := rm["verbs"].([]any)
			if contains(anyStrings(res), "pods") && (contains(anyStrings(verbs), "patch") || contains(anyStrings(verbs), "delete")) {
				t.Errorf("%s may change pods by default: %v", o.GetName(), rm)
			}
		}
	}
}

// Turned on, the chart installs what config/gate says, for its own release:
// the policies name the release's ServiceAccount as the manager and keep
// the release's namespace out, and the webhook is config/gate's.
func TestGatedPodsFollowConfigGate(t *testing.T) {
	objs := renderAs(t, "gatedPods.enabled=true")
	if !contains(managerArgs(t, objs, "x-queen-locks"), "--gated-pods") {
		t.Error("the manager does not run with --gated-pods")
	}
	manager := "system:serviceaccount:team:x-queen-locks"
	get(t, objs, "ServiceAccount/x-queen-locks")
	base := objects(t, readFile(t, "config/gate/policies.yaml"))
	for _, name := range []string{"queen-locks-gated-pods", "queen-locks-gated-pods-manager"} {
		want := get(t, base, "ValidatingAdmissionPolicy/"+name)
		got := get(t, objs, "ValidatingAdmissionPolicy/x-"+name)
		// The base's manager and namespace, as the chart must have them.
		wantSpec := strings.NewReplacer(
			"system:serviceaccount:queen-locks:queen-locks-controller-manager", manager,
			`"values":["kube-system","queen-locks"]`, `"values":["kube-system","team"]`,
		).Replace(jsonOf(t, field(t, want, "spec")))
		if d := cmp.Diff(wantSpec, jsonOf(t, field(t, got, "spec"))); d != "" {
			t.Errorf("policy %s differs from config/gate (-config +chart):\n%s", name, d)
		}
		b := get(t, objs, "ValidatingAdmissionPolicyBinding/x-"+name)
		if p := field(t, b, "spec", "policyName"); p != "x-"+name {
			t.Errorf("binding %s binds policy %v", b.GetName(), p)
		}
	}
	if !strings.Contains(jsonOf(t, field(t, get(t, objs, "ValidatingAdmissionPolicy/x-queen-locks-gated-pods-manager"), "spec")), manager) {
		t.Errorf("the manager's policy does not name %s", manager)
	}

	baseRole := objects(t, readFile(t, "config/gate/role.yaml"))
	if d := cmp.Diff(normRules(t, get(t, baseRole, "ClusterRole/queen-locks-gated-pods")),
		normRules(t, get(t, objs, "ClusterRole/x-queen-locks-gated-pods"))); d != "" {
		t.Errorf("the manager's pod rights differ from config/gate (-config +chart):\n%s", d)
	}
	crb := get(t, objs, "ClusterRoleBinding/x-queen-locks-gated-pods")
	want := []any{map[string]any{"kind": "ServiceAccount", "name": "x-queen-locks", "namespace": "team"}}
	if d := cmp.Diff(want, field(t, crb, "subjects")); d != "" {
		t.Errorf("the pod rights are bound to the wrong subject (-want +got):\n%s", d)
	}

	got := gatedWebhook(t, objs)
	if got == nil {
		t.Fatal("no gated pods' webhook rendered")
	}
	wantHook := gatedWebhook(t, objects(t, readFile(t, "config/gate/webhook.yaml")))
	svc := got["clientConfig"].(map[string]any)["service"].(map[string]any)
	if svc["name"] != "x-queen-locks" || svc["namespace"] != "team" || svc["path"] != "/mutate-gated-pod" {
		t.Errorf("the webhook calls %v", svc)
	}
	for _, k := range []string{"clientConfig", "timeoutSeconds"} {
		delete(got, k)
		delete(wantHook, k)
	}
	wantJSON := strings.Replace(jsonOf(t, wantHook), `"values":["kube-system","queen-locks"]`, `"values":["kube-system","team"]`, 1)
	if d := cmp.Diff(wantJSON, jsonOf(t, got)); d != "" {
		t.Errorf("the gated pods' webhook differs from config/gate (-config +chart):\n%s", d)
	}
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

func anyStrings(v []any) []string {
	out := make([]string, 0, len(v))
	for _, x := range v {
		out = append(out, x.(string))
	}
	return out
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// jsonOf is v as JSON, with map keys sorted, for comparing whole specs.
func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
