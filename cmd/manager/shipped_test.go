package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// testOnly says why a package a manager links is test code, or "" when it
// is not: the standard testing packages, the chaos harness's skewed clock
// and linearizability checker, and the project's packages for tests.
func testOnly(pkg string) string {
	const mod = "github.com/queen-locks/queen-locks/"
	switch {
	case pkg == "testing" || strings.HasPrefix(pkg, "testing/"):
		return "the standard testing package"
	case strings.HasPrefix(pkg, "github.com/anishathalye/porcupine"):
		return "the chaos run's linearizability checker"
	case pkg == mod+"internal/skewclock":
		return "the chaos run's skewed clock"
	case pkg == mod+"internal/controlplane" || strings.HasPrefix(pkg, mod+"internal/controlplane/"),
		pkg == mod+"internal/testcert", pkg == mod+"internal/metricstest":
		return "a package for tests"
	case strings.HasPrefix(pkg, mod+"test/"):
		return "a test harness"
	}
	return ""
}

func deps(t *testing.T, tags string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-tags", tags, "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	return strings.Fields(string(out))
}

// TestShippedManagerLinksNoTestCode: the manager make build and the image
// ship is built without tags and must link no test code; the chaos
// build (make chaos) is where the skewed clock goes, which shows the
// check looks at the right thing.
func TestShippedManagerLinksNoTestCode(t *testing.T) {
	for _, p := range deps(t, "") {
		if why := testOnly(p); why != "" {
			t.Errorf("the shipped manager links %s: %s", p, why)
		}
	}
	chaos := false
	for _, p := range deps(t, "chaos") {
		chaos = chaos || p == "github.com/queen-locks/queen-locks/internal/skewclock"
	}
	if !chaos {
		t.Error("the chaos build links no skewed clock: the check above proves nothing")
	}
}

// TestShippedManagerHasNoTestFlags builds the manager as make build does
// and asks it: no test-only flag in its help, and one given is refused.
func TestShippedManagerHasNoTestFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the manager")
	}
	bin := filepath.Join(t.TempDir(), "manager")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	help, _ := exec.Command(bin, "--help").CombinedOutput()
	if !strings.Contains(string(help), "-route-address") {
		t.Fatalf("--help does not list the manager's flags:\n%s", help)
	}
	if strings.Contains(string(help), "test-") {
		t.Errorf("--help offers a test-only flag:\n%s", help)
	}
	cmd := exec.Command(bin, "--test-clock-offset-file", os.DevNull)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "flag provided but not defined: -test-clock-offset-file") {
		t.Errorf("the shipped manager took --test-clock-offset-file (%v):\n%s", err, out)
	}
}
