package cli_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/internal/controlplane"
)

// The example's manifests are valid as the API server sees them: a dry run
// of each creates nothing and refuses a wrong field. The projected token
// volume is checked field by field, since queenlock depends on its path.
func TestCronJobExampleManifests(t *testing.T) {
	ns := namespace(t)
	ctx := context.Background()
	for _, file := range []string{"rbac.yaml", "cronjob.yaml"} {
		f, err := os.Open(filepath.Join(controlplane.Root(), "examples", "cronjob", file))
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			u.SetNamespace(ns)
			if err := env.Client.Create(ctx, u, client.DryRunAll, client.FieldValidation("Strict")); err != nil {
				t.Errorf("%s: %s %s: %v", file, u.GetKind(), u.GetName(), err)
			}
			if u.GetKind() != "CronJob" {
				continue
			}
			pod, _, _ := unstructured.NestedMap(u.Object, "spec", "jobTemplate", "spec", "template", "spec")
			volumes, _, _ := unstructured.NestedSlice(pod, "volumes")
			var token map[string]any
			for _, v := range volumes {
				if v.(map[string]any)["name"] == "queen-locks-token" {
					sources, _, _ := unstructured.NestedSlice(v.(map[string]any), "projected", "sources")
					if len(sources) == 1 {
						token, _, _ = unstructured.NestedMap(sources[0].(map[string]any), "serviceAccountToken")
					}
				}
			}
			if token["audience"] != "queen-locks" || token["path"] != "token" || token["expirationSeconds"] != int64(3600) {
				t.Errorf("the projected token source is %v", token)
			}
			containers, _, _ := unstructured.NestedSlice(pod, "containers")
			mounted := false
			for _, m := range containers[0].(map[string]any)["volumeMounts"].([]any) {
				mm := m.(map[string]any)
				mounted = mounted || (mm["name"] == "queen-locks-token" && mm["mountPath"] == "/var/run/secrets/queen-locks")
			}
			if !mounted {
				t.Error("the projected token is not mounted at /var/run/secrets/queen-locks")
			}
		}
		f.Close()
	}
}
