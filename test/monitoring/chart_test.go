package monitoring

import (
	"encoding/json"
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "write the chart's rules/alerts.yaml from its PrometheusRule template")

// everything turns every monitoring object of the chart on.
var everything = []string{"serviceMonitor.enabled=true", "podMonitor.enabled=true", "prometheusRule.enabled=true", "grafanaDashboard.enabled=true"}

func monitoringObjects(objs map[string]*unstructured.Unstructured) []string {
	var found []string
	for k, o := range objs {
		switch {
		case o.GetKind() == "ServiceMonitor", o.GetKind() == "PodMonitor", o.GetKind() == "PrometheusRule",
			strings.HasSuffix(k, "-dashboard"), strings.HasSuffix(k, "-metrics-scraper"):
			found = append(found, k)
		}
	}
	return found
}

func get(t *testing.T, objs map[string]*unstructured.Unstructured, key string) *unstructured.Unstructured {
	t.Helper()
	o, ok := objs[key]
	if !ok {
		t.Fatalf("%s not rendered; have %v", key, monitoringObjects(objs))
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

func TestNoMonitoringObjectsByDefault(t *testing.T) {
	if found := monitoringObjects(render(t)); len(found) != 0 {
		t.Fatalf("rendered by default: %v", found)
	}
}

func TestMonitoringValuesRenderEveryObject(t *testing.T) {
	objs := render(t, append(everything, "prometheusRule.labels.release=prometheus", "prometheusRule.alertLabels.team=platform")...)
	sm := get(t, objs, "ServiceMonitor/queen-locks")
	ep := field(t, sm, "spec", "endpoints").([]any)[0].(map[string]any)
	if ep["port"] != "metrics" || ep["scheme"] != "https" || ep["honorLabels"] != true || ep["bearerTokenFile"] == nil {
		t.Errorf("ServiceMonitor endpoint %v", ep)
	}

	pm := get(t, objs, "PodMonitor/queen-locks")
	pe := field(t, pm, "spec", "podMetricsEndpoints").([]any)[0].(map[string]any)
	cred := pe["authorization"].(map[string]any)["credentials"].(map[string]any)
	if pe["port"] != "metrics" || pe["scheme"] != "https" || pe["honorLabels"] != true || cred["name"] != "queen-locks-metrics-scraper" || cred["key"] != "token" {
		t.Errorf("PodMonitor endpoint %v", pe)
	}
	if sel := field(t, pm, "spec", "selector", "matchLabels").(map[string]any); sel["app.kubernetes.io/name"] != "queen-locks" {
		t.Errorf("PodMonitor selects %v", sel)
	}
	// The token it sends is a ServiceAccount's that may read /metrics.
	get(t, objs, "ServiceAccount/queen-locks-metrics-scraper")
	secret := get(t, objs, "Secret/queen-locks-metrics-scraper")
	if secret.Object["type"] != "kubernetes.io/service-account-token" || secret.GetAnnotations()["kubernetes.io/service-account.name"] != "queen-locks-metrics-scraper" {
		t.Errorf("token Secret %v", secret.Object)
	}
	crb := get(t, objs, "ClusterRoleBinding/queen-locks-metrics-scraper")
	if ref := field(t, crb, "roleRef", "name"); ref != "queen-locks-metrics-reader" {
		t.Errorf("the scraper is bound to %v", ref)
	}

	rule := get(t, objs, "PrometheusRule/queen-locks")
	if rule.GetLabels()["release"] != "prometheus" {
		t.Errorf("PrometheusRule labels %v", rule.GetLabels())
	}
	alerts := alertsOf(t, rule)
	if len(alerts) != 8 {
		t.Errorf("%d alerts, want 8", len(alerts))
	}
	for name, a := range alerts {
		ann := a["annotations"].(map[string]any)
		for _, k := range []string{"summary", "description", "runbook_url"} {
			if s, _ := ann[k].(string); strings.TrimSpace(s) == "" {
				t.Errorf("%s has no %s", name, k)
			}
		}
		labels := a["labels"].(map[string]any)
		if labels["team"] != "platform" || (labels["severity"] != "warning" && labels["severity"] != "critical") {
			t.Errorf("%s labels %v", name, labels)
		}
	}

	cm := get(t, objs, "ConfigMap/queen-locks-dashboard")
	if cm.GetLabels()["grafana_dashboard"] != "1" || cm.GetNamespace() != "queen-locks" {
		t.Errorf("dashboard ConfigMap labels %v in %s", cm.GetLabels(), cm.GetNamespace())
	}
	want, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(strings.TrimSpace(string(want)), field(t, cm, "data", "queen-locks.json")); d != "" {
		t.Errorf("the ConfigMap's dashboard is not the chart's file (-file +configmap):\n%s", d)
	}
}

func TestMonitoringValuesAdjust(t *testing.T) {
	objs := render(t, append(everything,
		"podMonitor.tokenSecret.name=prometheus-token",
		"prometheusRule.alerts.routeErrors.ratio=0.2", "prometheusRule.alerts.routeErrors.for=15m",
		"prometheusRule.alerts.noLeader.severity=page", "prometheusRule.alerts.webhookSlow.enabled=false",
		"grafanaDashboard.label=dashboards", "grafanaDashboard.labelValue=queen", "grafanaDashboard.namespace=grafana")...)
	// A Secret of one's own: the chart makes no identity for the scrape.
	for _, k := range []string{"ServiceAccount/queen-locks-metrics-scraper", "Secret/queen-locks-metrics-scraper", "ClusterRoleBinding/queen-locks-metrics-scraper"} {
		if _, ok := objs[k]; ok {
			t.Errorf("%s rendered with tokenSecret.name set", k)
		}
	}
	pe := field(t, get(t, objs, "PodMonitor/queen-locks"), "spec", "podMetricsEndpoints").([]any)[0].(map[string]any)
	if name := pe["authorization"].(map[string]any)["credentials"].(map[string]any)["name"]; name != "prometheus-token" {
		t.Errorf("the PodMonitor sends the token of %v", name)
	}
	alerts := alertsOf(t, get(t, objs, "PrometheusRule/queen-locks"))
	if _, ok := alerts["QueenLocksWebhookSlow"]; ok || len(alerts) != 7 {
		t.Errorf("alerts %d, with QueenLocksWebhookSlow turned off", len(alerts))
	}
	re := alerts["QueenLocksRouteErrors"]
	if !strings.HasSuffix(strings.TrimSpace(re["expr"].(string)), "> 0.2") || re["for"] != "15m" {
		t.Errorf("QueenLocksRouteErrors: %v for %v", re["expr"], re["for"])
	}
	if s := alerts["QueenLocksNoLeader"]["labels"].(map[string]any)["severity"]; s != "page" {
		t.Errorf("QueenLocksNoLeader severity %v", s)
	}
	cm := get(t, objs, "ConfigMap/queen-locks-dashboard")
	if cm.GetLabels()["dashboards"] != "queen" || cm.GetNamespace() != "grafana" {
		t.Errorf("dashboard ConfigMap labels %v in %s", cm.GetLabels(), cm.GetNamespace())
	}
}

func TestChartLintsWithMonitoring(t *testing.T) {
	args := []string{"lint", chart, "--strict"}
	for _, s := range everything {
		args = append(args, "--set", s)
	}
	run(t, helm, args...)
}

// alertsOf answers the alerting rules of a PrometheusRule, by name.
func alertsOf(t *testing.T, rule *unstructured.Unstructured) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, g := range field(t, rule, "spec", "groups").([]any) {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			rm := r.(map[string]any)
			if name, ok := rm["alert"].(string); ok {
				out[name] = rm
			}
		}
	}
	return out
}

// rulesHeader opens the chart's rules/alerts.yaml.
const rulesHeader = `# The alerts of queen-locks (docs/operations.md#alerts), for promtool and
# for a Prometheus without the prometheus-operator. Generated from
# templates/prometheusrule.yaml with the chart's default values by
# ` + "`make monitoring-rules`" + `; do not edit: change the template and run it.
`

// rulesFromChart renders the PrometheusRule with the default values and
// answers its spec as a rules file.
func rulesFromChart(t *testing.T) string {
	t.Helper()
	out := run(t, helm, "template", "queen-locks", chart, "--namespace", "queen-locks",
		"--set", "prometheusRule.enabled=true", "--show-only", "templates/prometheusrule.yaml")
	_, spec, ok := strings.Cut(out, "\nspec:\n")
	if !ok {
		t.Fatalf("no spec in the rendered PrometheusRule:\n%s", out)
	}
	var b strings.Builder
	b.WriteString(rulesHeader)
	for _, line := range strings.Split(strings.TrimRight(spec, "\n"), "\n") {
		b.WriteString(strings.TrimPrefix(line, "  ") + "\n")
	}
	return b.String()
}

// The plain rules file is the chart's PrometheusRule, so that what promtool
// and the Prometheus test check is what the chart installs.
func TestRulesFileIsTheChartsRule(t *testing.T) {
	want := rulesFromChart(t)
	if *update {
		if err := os.WriteFile(rulesFile, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, string(got)); d != "" {
		t.Fatalf("charts/queen-locks/rules/alerts.yaml is not the chart's PrometheusRule; run make monitoring-rules (-want +got):\n%s", d)
	}
	var parsed struct {
		Groups []struct {
			Rules []map[string]any `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(got, &parsed); err != nil || len(parsed.Groups) == 0 {
		t.Fatalf("rules file: %v", err)
	}
}

// anchor is the anchor GitHub gives a Markdown heading.
func anchor(heading string) string {
	s := strings.ToLower(strings.TrimSpace(heading))
	s = regexp.MustCompile(`[^\p{L}\p{N}\s_-]`).ReplaceAllString(s, "")
	return strings.ReplaceAll(s, " ", "-")
}

// Every alert's runbook_url points at a section of docs/operations.md that
// exists, and every section says what it means, how to check and what to do.
func TestEveryAlertHasARunbook(t *testing.T) {
	doc, err := os.ReadFile(operations)
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{}
	var cur string
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "#") {
			cur = anchor(strings.TrimLeft(line, "#"))
			sections[cur] = ""
			continue
		}
		if cur != "" {
			sections[cur] += line + "\n"
		}
	}
	for name, a := range alertsOf(t, get(t, render(t, "prometheusRule.enabled=true"), "PrometheusRule/queen-locks")) {
		url := a["annotations"].(map[string]any)["runbook_url"].(string)
		base, frag, ok := strings.Cut(url, "#")
		if !ok || !strings.HasSuffix(base, "docs/operations.md") || frag != strings.ToLower(name) {
			t.Errorf("%s: runbook_url %s, want docs/operations.md#%s", name, url, strings.ToLower(name))
			continue
		}
		body, ok := sections[frag]
		if !ok {
			t.Errorf("%s: docs/operations.md has no section #%s", name, frag)
			continue
		}
		for _, part := range []string{"**Means**", "**Check**", "**Do**"} {
			if !strings.Contains(body, part) {
				t.Errorf("%s: its runbook section lacks %s", name, part)
			}
		}
	}
}

// panelQueries answers every query of the chart's dashboard, with the
// panel it belongs to.
func panelQueries(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil || d.UID == "" {
		t.Fatalf("the dashboard is not a Grafana dashboard: %v", err)
	}
	out := map[string]string{}
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			if strings.TrimSpace(q.Expr) == "" {
				t.Errorf("panel %q query %s is empty", p.Title, q.RefID)
			}
			out[p.Title+" "+q.RefID] = q.Expr
		}
	}
	return out
}

func TestDashboardPanelsHaveQueries(t *testing.T) {
	if n := len(panelQueries(t)); n < 15 {
		t.Errorf("%d queries", n)
	}
}
