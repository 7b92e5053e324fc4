package charts

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// The permit webhook lets through the manager's own stamped updates by the
// same matchConditions as the kustomize install
// (config/default/webhook_manager_updates.yaml, which the test control
// plane applies), naming the chart's own ServiceAccount: a different rule
// here would be a rule no test runs.
func TestPermitWebhookSkipsTheManagersStampedUpdates(t *testing.T) {
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
	if err := yaml.Unmarshal([]byte(readFile(t, "config/default/webhook_manager_updates.yaml")), &patch); err != nil || len(patch) != 1 {
		t.Fatalf("config/default/webhook_manager_updates.yaml: %v (%d operations)", err, len(patch))
	}
	want := jsonOf(t, patch[0].Value)
	want = strings.ReplaceAll(want, "system:serviceaccount:queen-locks:queen-locks-controller-manager", "system:serviceaccount:team:x-queen-locks")
	if d := cmp.Diff(want, jsonOf(t, got)); d != "" {
		t.Errorf("the chart's matchConditions differ from config/default's (-config +chart):\n%s", d)
	}
}
