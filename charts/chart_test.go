package charts

import (
	"bytes"
	"encoding/base64"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/queen-locks/queen-locks/internal/controlplane"
)

var (
	root  = controlplane.Root()
	helm  = filepath.Join(root, "bin", "helm")
	chart = filepath.Join(root, "charts", "queen-locks")
)

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", filepath.Base(name), strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// objects splits a YAML stream into objects, by kind/name.
func objects(t *testing.T, stream string) map[string]*unstructured.Unstructured {
	t.Helper()
	out := map[string]*unstructured.Unstructured{}
	for _, u := range list(t, stream) {
		out[u.GetKind()+"/"+u.GetName()] = u
	}
	return out
}

// list splits a YAML stream into objects, in order.
func list(t *testing.T, stream string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, doc := range strings.Split(stream, "\n---") {
		js, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("rendered YAML does not parse: %v\n%s", err, doc)
		}
		if string(js) == "null" || string(js) == "{}" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			t.Fatalf("rendered object does not decode: %v\n%s", err, doc)
		}
		out = append(out, u)
	}
	return out
}

func render(t *testing.T, sets ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	args := []string{"template", "queen-locks", chart, "--namespace", "queen-locks"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return objects(t, run(t, helm, args...))
}

func get(t *testing.T, objs map[string]*unstructured.Unstructured, key string) *unstructured.Unstructured {
	t.Helper()
	o, ok := objs[key]
	if !ok {
		var keys []string
		for k := range objs {
			keys = append(keys, k)
		}
		t.Fatalf("%s not rendered; have %v", key, keys)
	}
	return o
}

func field(t *testing.T, o *unstructured.Unstructured, path ...string) any {
	t.Helper()
	v, ok, err := unstructured.NestedFieldNoCopy(o.Object, path...)
	if err != nil || !ok {
		t.Fatalf("%s/%s has no %s", o.GetKind(), o.GetName(), strings.Join(path, "."))
	}
	return v
}

func TestLint(t *testing.T) {
	for _, sets := range [][]string{nil, {"webhook.certificate.source=certManager,serviceMonitor.enabled=true,crds.install=false,networkPolicy.enabled=true"}} {
		args := []string{"lint", chart, "--strict"}
		for _, s := range sets {
			args = append(args, "--set", s)
		}
		run(t, helm, args...)
	}
}

func TestDefaults(t *testing.T) {
	objs := render(t)
	dep := get(t, objs, "Deployment/queen-locks")
	if r := field(t, dep, "spec", "replicas"); r != int64(2) {
		t.Errorf("replicas %v, want 2", r)
	}
	c := field(t, dep, "spec", "template", "spec", "containers").([]any)[0].(map[string]any)
	args := strings.Join(toStrings(c["args"]), " ")
	for _, want := range []string{"--auth=token", "--leader-elect=true", "--route-address=:6632", "--expiry-grace=1s",
		"--route-audiences=queen-locks", "--route-tls-cert-dir=/tmp/k8s-webhook-server/serving-certs"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %s", args, want)
		}
	}
	sc := c["securityContext"].(map[string]any)
	if sc["readOnlyRootFilesystem"] != true || sc["runAsNonRoot"] != true || sc["allowPrivilegeEscalation"] != false ||
		cmp.Diff([]any{"ALL"}, sc["capabilities"].(map[string]any)["drop"]) != "" {
		t.Errorf("container securityContext %v is not restricted", sc)
	}
	if c["livenessProbe"] == nil || c["readinessProbe"] == nil || c["resources"] == nil {
		t.Errorf("probes or resources missing: %v", c)
	}
	if field(t, dep, "spec", "template", "spec", "affinity", "podAntiAffinity") == nil {
		t.Error("no anti-affinity")
	}
	get(t, objs, "PodDisruptionBudget/queen-locks")
	ports := map[string]int64{}
	for _, p := range field(t, get(t, objs, "Service/queen-locks"), "spec", "ports").([]any) {
		pm := p.(map[string]any)
		ports[pm["name"].(string)] = pm["port"].(int64)
	}
	if cmp.Diff(map[string]int64{"route": 6632, "webhook": 443, "metrics": 8443}, ports) != "" {
		t.Errorf("service ports %v", ports)
	}
	// The CRD is installed and kept on uninstall.
	crd := get(t, objs, "CustomResourceDefinition/queenlocks.locks.queen.dev")
	if crd.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
		t.Errorf("CRD annotations %v: not kept on uninstall", crd.GetAnnotations())
	}
	// Aggregated roles for workloads.
	if l := get(t, objs, "ClusterRole/queen-locks-holder").GetLabels(); l["rbac.authorization.k8s.io/aggregate-to-edit"] != "true" {
		t.Errorf("holder labels %v", l)
	}
	if l := get(t, objs, "ClusterRole/queen-locks-viewer").GetLabels(); l["rbac.authorization.k8s.io/aggregate-to-view"] != "true" {
		t.Errorf("viewer labels %v", l)
	}
	// Webhooks fail closed; the certificate the chart made signs for the
	// Service and its CA is the webhooks' caBundle.
	secret := get(t, objs, "Secret/queen-locks-webhook-cert")
	ca := field(t, secret, "data", "ca.crt").(string)
	leaf, _ := base64.StdEncoding.DecodeString(field(t, secret, "data", "tls.crt").(string))
	if b, _ := pem.Decode(leaf); b == nil || !strings.Contains(string(leaf), "CERTIFICATE") {
		t.Error("tls.crt is not a PEM certificate")
	}
	// The route serves TLS with the same certificate, and its CA is
	// published for callers.
	caPEM, _ := base64.StdEncoding.DecodeString(ca)
	if got := field(t, get(t, objs, "ConfigMap/queen-locks-ca"), "data", "ca.crt"); strings.TrimSpace(got.(string)) != strings.TrimSpace(string(caPEM)) {
		t.Errorf("ConfigMap queen-locks-ca holds %q, want the webhooks' CA", got)
	}
	for kind, want := range map[string]int{"MutatingWebhookConfiguration": 2, "ValidatingWebhookConfiguration": 3} {
		whs := field(t, get(t, objs, kind+"/queen-locks"), "webhooks").([]any)
		if len(whs) != want {
			t.Errorf("%s has %d webhooks, want %d", kind, len(whs), want)
		}
		for _, w := range whs {
			wm := w.(map[string]any)
			cc := wm["clientConfig"].(map[string]any)
			if wm["failurePolicy"] != "Fail" || cc["caBundle"] != ca || cc["service"].(map[string]any)["name"] != "queen-locks" {
				t.Errorf("%s %s: failurePolicy %v, caBundle matches %v, service %v", kind, wm["name"], wm["failurePolicy"], cc["caBundle"] == ca, cc["service"])
			}
			// A scale write carries no labels: that webhook selects none.
			if strings.Contains(wm["name"].(string), "guarded") && wm["name"] != "vguarded-scale.locks.queen.dev" {
				sel := wm["objectSelector"].(map[string]any)["matchLabels"].(map[string]any)
				if sel["locks.queen.dev/guarded"] != "true" {
					t.Errorf("%s selects %v", wm["name"], sel)
				}
			}
		}
	}
}

func TestOtherValues(t *testing.T) {
	objs := render(t, "webhook.certificate.source=certManager", "serviceMonitor.enabled=true", "crds.install=false",
		"networkPolicy.enabled=true", "replicas=3")
	if _, ok := objs["CustomResourceDefinition/queenlocks.locks.queen.dev"]; ok {
		t.Error("CRD rendered with crds.install=false")
	}
	if _, ok := objs["Secret/queen-locks-webhook-cert"]; ok {
		t.Error("the chart made a certificate although cert-manager makes it")
	}
	cert := get(t, objs, "Certificate/queen-locks-webhook")
	if field(t, cert, "spec", "secretName") != "queen-locks-webhook-cert" {
		t.Error("Certificate writes another Secret than the pods mount")
	}
	get(t, objs, "Issuer/queen-locks-selfsigned")
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		wh := get(t, objs, kind+"/queen-locks")
		if wh.GetAnnotations()["cert-manager.io/inject-ca-from"] != "queen-locks/queen-locks-webhook" {
			t.Errorf("%s annotations %v", kind, wh.GetAnnotations())
		}
	}
	get(t, objs, "ServiceMonitor/queen-locks")
	get(t, objs, "NetworkPolicy/queen-locks")
	if r := field(t, get(t, objs, "Deployment/queen-locks"), "spec", "replicas"); r != int64(3) {
		t.Errorf("replicas %v", r)
	}
	// cert-manager's CA is not known when the chart renders.
	if _, ok := objs["ConfigMap/queen-locks-ca"]; ok {
		t.Error("a CA ConfigMap rendered with certManager")
	}
	// A wrong certificate source is refused with a clear message.
	out, err := exec.Command(helm, "template", "x", chart, "--set", "webhook.certificate.source=magic").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "helm or certManager") {
		t.Errorf("bad certificate source: %v %s", err, out)
	}
}

// auth=none serves every caller unverified: the chart refuses to render it,
// whatever else is set.
func TestAuthNoneIsRefused(t *testing.T) {
	for _, sets := range []string{"auth=none", "auth=none,webhook.certificate.source=certManager", "auth=anything"} {
		out, err := exec.Command(helm, "template", "x", chart, "--set", sets).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "renders only auth=token") {
			t.Errorf("%s: %v %s", sets, err, out)
		}
	}
}

// The route can serve plain HTTP, and its CA can be copied where callers
// run; the audiences and limits reach the manager's flags.
func TestRouteValues(t *testing.T) {
	objs := render(t, "route.tls.enabled=false")
	args := strings.Join(toStrings(field(t, get(t, objs, "Deployment/queen-locks"), "spec", "template", "spec", "containers").([]any)[0].(map[string]any)["args"]), " ")
	if strings.Contains(args, "--route-tls-cert-dir") {
		t.Errorf("args %q serve TLS with route.tls.enabled=false", args)
	}
	if _, ok := objs["ConfigMap/queen-locks-ca"]; ok {
		t.Error("a CA ConfigMap rendered without TLS")
	}
	sets := []string{"route.tls.caNamespaces={team-a,team-b}", "route.audiences={queen-locks,other}",
		"route.limits.max-calls=100", "route.limits.max-body-memory=67108864"}
	objs = render(t, sets...)
	args = strings.Join(toStrings(field(t, get(t, objs, "Deployment/queen-locks"), "spec", "template", "spec", "containers").([]any)[0].(map[string]any)["args"]), " ")
	for _, want := range []string{"--route-audiences=queen-locks,other", "--route-max-calls=100", "--route-max-body-memory=67108864"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %s", args, want)
		}
	}
	var nss []string
	args2 := []string{"template", "queen-locks", chart, "--namespace", "queen-locks"}
	for _, set := range sets {
		args2 = append(args2, "--set", set)
	}
	for _, o := range list(t, run(t, helm, args2...)) {
		if o.GetKind() == "ConfigMap" && o.GetName() == "queen-locks-ca" {
			nss = append(nss, o.GetNamespace())
		}
	}
	sortStrings(nss)
	if d := cmp.Diff([]string{"queen-locks", "team-a", "team-b"}, nss); d != "" {
		t.Errorf("CA ConfigMaps in (-want +got):\n%s", d)
	}
}

// The manager may do exactly what its code says it needs, as controller-gen
// generates it into config/rbac/role.yaml from the +kubebuilder:rbac markers:
// nothing more.
func TestManagerRoleIsTheGeneratedOne(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(root, "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	generated := get(t, objects(t, string(raw)), "ClusterRole/queen-locks-manager")
	if d := cmp.Diff(normRules(t, generated), normRules(t, get(t, render(t), "ClusterRole/queen-locks-manager"))); d != "" {
		t.Errorf("manager rules differ (-generated +chart):\n%s", d)
	}
}

// Workloads get the rights the route checks, through two aggregated roles.
func TestWorkloadRoles(t *testing.T) {
	objs := render(t)
	for name, want := range map[string]struct {
		rules     []string
		aggregate string
	}{
		"queen-locks-holder": {[]string{
			"locks.queen.dev|queenlocks|create,delete,get,list,patch,update,watch",
			"locks.queen.dev|queenlockwaiters|create,delete,get,list,patch,update,watch",
		}, "rbac.authorization.k8s.io/aggregate-to-edit"},
		"queen-locks-viewer": {[]string{"locks.queen.dev|queenlocks,queenlockwaiters|get,list,watch"}, "rbac.authorization.k8s.io/aggregate-to-view"},
	} {
		role := get(t, objs, "ClusterRole/"+name)
		if d := cmp.Diff(want.rules, normRules(t, role)); d != "" {
			t.Errorf("%s rules (-want +got):\n%s", name, d)
		}
		if role.GetLabels()[want.aggregate] != "true" {
			t.Errorf("%s labels %v lack %s", name, role.GetLabels(), want.aggregate)
		}
	}
}

// The chart and config/ come from the same sources: the CRD and the
// manager's RBAC are generated, and the workload roles and webhooks say the
// same thing in both.
func TestChartMatchesGeneratedManifests(t *testing.T) {
	objs := render(t)
	config := objects(t, run(t, filepath.Join(root, "bin", "kubectl"), "kustomize", filepath.Join(root, "config", "default")))
	for _, crdKey := range []string{"CustomResourceDefinition/queenlocks.locks.queen.dev", "CustomResourceDefinition/queenlockwaiters.locks.queen.dev", "CustomResourceDefinition/queenlockfences.locks.queen.dev"} {
		if d := cmp.Diff(field(t, get(t, config, crdKey), "spec"), field(t, get(t, objs, crdKey), "spec")); d != "" {
			t.Errorf("%s differs (-config +chart):\n%s", crdKey, d)
		}
	}
	for chartName, configName := range map[string]string{
		"ClusterRole/queen-locks-manager": "ClusterRole/queen-locks-manager",
		"ClusterRole/queen-locks-holder":  "ClusterRole/queen-locks-holder",
		"ClusterRole/queen-locks-viewer":  "ClusterRole/queen-locks-viewer",
	} {
		if d := cmp.Diff(normRules(t, get(t, config, configName)), normRules(t, get(t, objs, chartName))); d != "" {
			t.Errorf("%s rules differ (-config +chart):\n%s", chartName, d)
		}
	}
	paths := func(objs map[string]*unstructured.Unstructured) map[string]string {
		out := map[string]string{}
		for _, o := range objs {
			if !strings.HasSuffix(o.GetKind(), "WebhookConfiguration") {
				continue
			}
			for _, w := range field(t, o, "webhooks").([]any) {
				wm := w.(map[string]any)
				out[wm["name"].(string)] = wm["clientConfig"].(map[string]any)["service"].(map[string]any)["path"].(string)
			}
		}
		return out
	}
	if d := cmp.Diff(paths(config), paths(objs)); d != "" {
		t.Errorf("webhooks differ (-config +chart):\n%s", d)
	}
	// Callers send bearer tokens to the route: the kustomize base serves it
	// over TLS, as the chart does, never in clear.
	dep := get(t, config, "Deployment/queen-locks-controller-manager")
	c := field(t, dep, "spec", "template", "spec", "containers").([]any)[0].(map[string]any)
	if args := strings.Join(toStrings(c["args"]), " "); !strings.Contains(args, "--route-tls-cert-dir=") || !strings.Contains(args, "--auth=token") {
		t.Errorf("the kustomize base's manager args %q serve the route without TLS", args)
	}
	if _, ok := config["Certificate/queen-locks-route-cert"]; !ok {
		t.Error("the kustomize base has no certificate for the route")
	}
}

// normRules sorts verbs, so rule order within a verb list does not matter.
func normRules(t *testing.T, o *unstructured.Unstructured) []string {
	t.Helper()
	var out []string
	for _, r := range field(t, o, "rules").([]any) {
		rm := r.(map[string]any)
		verbs := toStrings(rm["verbs"])
		sortStrings(verbs)
		out = append(out, strings.Join(toStrings(rm["apiGroups"]), ",")+"|"+strings.Join(toStrings(rm["resources"]), ",")+"|"+strings.Join(verbs, ","))
	}
	sortStrings(out)
	return out
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

func sortStrings(s []string) {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
}

func writeKubeconfig(t *testing.T, e *controlplane.Env) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, e.Env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
