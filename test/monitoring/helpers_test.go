package monitoring

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/queen-locks/queen-locks/internal/controlplane"
)

var (
	root       = controlplane.Root()
	helm       = filepath.Join(root, "bin", "helm")
	chart      = filepath.Join(root, "charts", "queen-locks")
	rulesFile  = filepath.Join(chart, "rules", "alerts.yaml")
	dashboard  = filepath.Join(chart, "dashboards", "queen-locks.json")
	operations = filepath.Join(root, "docs", "operations.md")
)

// tool finds a program of Debian's prometheus package. Without it the test
// skips, saying how to install it; in CI (CI set, as CI=true) it fails
// instead, so that a CI that lost the package cannot pass by skipping.
func tool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	msg := name + " is not on PATH: install Debian's prometheus package with hack/handles/prometheus.sh (as root; make handle-deps runs it)"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

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

// render runs helm template over the chart, in the namespace queen-locks,
// with the given --set values, and answers the objects by kind/name.
func render(t *testing.T, sets ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	args := []string{"template", "queen-locks", chart, "--namespace", "queen-locks"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	out := map[string]*unstructured.Unstructured{}
	for _, doc := range strings.Split(run(t, helm, args...), "\n---") {
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
		out[u.GetKind()+"/"+u.GetName()] = u
	}
	return out
}
