package main

import (
	"os/exec"
	"strings"
	"testing"
)

// make dev's binary runs the control plane the tests use, not the tests:
// it links no testing package (internal/controlplane takes its own small
// T and M, not testing's types).
func TestDevLinksNoTesting(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "testing" || strings.HasPrefix(p, "testing/") {
			t.Errorf("cmd/dev links %s", p)
		}
	}
}
