package charts

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// rolesRules are the rules of every ClusterRole and Role the chart renders.
func roleRules(t *testing.T, objs map[string]*unstructured.Unstructured) map[string][]any {
	t.Helper()
	out := map[string][]any{}
	for key, o := range objs {
		if o.GetKind() == "ClusterRole" || o.GetKind() == "Role" {
			rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
			out[key] = rules
		}
	}
	return out
}

// The manager's rights on the chart's default guarded kinds (ConfigMaps and
// Secrets) are the fence's alone: patch to raise a bound object's record,
// get (metadata only, though RBAC cannot say so) to tell whether an entry
// of a full slot is still bound. Nothing may list, create, update, delete
// or watch them, and no role grants anything on every resource.
func TestManagerRightsOnGuardedKindsAreTheFencesAlone(t *testing.T) {
	fence := []any{"get", "patch"}
	for key, rules := range roleRules(t, render(t)) {
		for _, r := range rules {
			m := r.(map[string]any)
			res, _ := m["resources"].([]any)
			if slices.Contains(res, any("*")) {
				t.Errorf("%s grants %v on every resource", key, m["verbs"])
			}
			if !slices.Contains(res, any("secrets")) && !slices.Contains(res, any("configmaps")) {
				continue
			}
			for _, v := range m["verbs"].([]any) {
				if !slices.Contains(fence, v) {
					t.Errorf("%s grants %q on %v: the fence needs only %v", key, v, res, fence)
				}
			}
		}
	}
	args := strings.Join(containerArgs(t, render(t)), " ")
	if !strings.Contains(args, "--guarded-resources=configmaps/v1,secrets/v1") {
		t.Errorf("the manager is not told the guarded kinds: %s", args)
	}
}

// A guarded kind that can be scaled is readable, and named to the manager;
// the client CA and the webhook's bounds reach its flags; webhookFrom
// narrows the webhook port's NetworkPolicy.
func TestWebhookHardeningValues(t *testing.T) {
	objs := render(t, "guard.rules[0].apiGroups[0]=apps", "guard.rules[0].apiVersions[0]=v1", "guard.rules[0].resources[0]=deployments",
		"webhook.clientCA=-----BEGIN CERTIFICATE-----", "webhook.limits.max-body-memory=33554432",
		"networkPolicy.enabled=true", "networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.0/24")
	rules := roleRules(t, objs)["ClusterRole/queen-locks-guard"]
	if len(rules) != 1 || !slices.Contains(rules[0].(map[string]any)["resources"].([]any), any("deployments")) {
		t.Errorf("guard role rules %v", rules)
	}
	args := containerArgs(t, objs)
	for _, want := range []string{"--guarded-resources=deployments.apps/v1", "--webhook-client-ca-file=/etc/queen-locks/webhook-client-ca/ca.crt", "--webhook-max-body-memory=33554432"} {
		if !slices.Contains(args, want) {
			t.Errorf("args %v lack %s", args, want)
		}
	}
	get(t, objs, "ConfigMap/queen-locks-webhook-client-ca")
	ingress := field(t, get(t, objs, "NetworkPolicy/queen-locks"), "spec", "ingress").([]any)
	if from := ingress[0].(map[string]any)["from"]; from == nil {
		t.Errorf("the webhook port is open to every source despite webhookFrom: %v", ingress[0])
	}
}

func containerArgs(t *testing.T, objs map[string]*unstructured.Unstructured) []string {
	t.Helper()
	cs := field(t, get(t, objs, "Deployment/queen-locks"), "spec", "template", "spec", "containers").([]any)
	var out []string
	for _, a := range cs[0].(map[string]any)["args"].([]any) {
		out = append(out, a.(string))
	}
	return out
}
