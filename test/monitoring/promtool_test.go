package monitoring

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"
)

var unitTests = filepath.Join(root, "test", "monitoring", "testdata", "alerts.test.yaml")

func TestPromtoolChecksTheRules(t *testing.T) {
	run(t, tool(t, "promtool"), "check", "rules", rulesFile)
}

// alertNames answers the alerts of the chart's rules file, sorted.
func alertNames(t *testing.T) []string {
	t.Helper()
	return slices.Sorted(maps.Keys(alertExprs(t)))
}

// Every alert fires in some case of testdata/alerts.test.yaml and stays
// quiet in another, and promtool agrees with what each case expects.
func TestPromtoolUnitTests(t *testing.T) {
	promtool := tool(t, "promtool")
	raw, err := os.ReadFile(unitTests)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range file.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	names := alertNames(t)
	if len(names) == 0 {
		t.Fatal("no alerts in the rules file")
	}
	for _, name := range names {
		if !fires[name] {
			t.Errorf("%s: no case where it fires", name)
		}
		if !quiet[name] {
			t.Errorf("%s: no case where it stays quiet", name)
		}
	}
	for name := range fires {
		if !slices.Contains(names, name) {
			t.Errorf("the cases test %s, which is not an alert of the chart", name)
		}
	}
	// promtool finds the rule files relative to the test file.
	run(t, promtool, "test", "rules", unitTests)
}
