package lintconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// root is the repository's root, two directories above this file.
func root(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot tell where this test file is")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// copyModule copies the root module's Go sources (no tests: the rules
// are about what a package's own files import), go.mod, go.sum and
// .golangci.yml into dir. Nested modules (the tools under hack/), the
// handles in other languages and bin/ are left out.
func copyModule(t *testing.T, from, dir string) {
	t.Helper()
	for _, f := range []string{"go.mod", "go.sum", ".golangci.yml"} {
		copyFile(t, filepath.Join(from, f), filepath.Join(dir, f))
	}
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		if d.IsDir() {
			if rel == "." {
				return nil
			}
			if strings.HasPrefix(d.Name(), ".") || rel == "bin" || rel == "clients" || rel == "docs" || rel == "charts" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go") {
			copyFile(t, path, filepath.Join(dir, rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDepguardFailsAPlantedImport plants, in a copy of the tree, the two
// kinds of import the layering forbids: a client package importing
// internal/ (handle importing internal/testcert) and a lower layer
// importing a higher one that would not make a cycle (permit/gatedpod
// importing locks). depguard must report both, and nothing else: the
// tree as it is passes.
func TestDepguardFailsAPlantedImport(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checks the client packages with golangci-lint")
	}
	repo := root(t)
	lint := filepath.Join(repo, "bin", "golangci-lint")
	if _, err := os.Stat(lint); err != nil {
		t.Fatalf("%s is not built: run make tools (%v)", lint, err)
	}
	dir := t.TempDir()
	copyModule(t, repo, dir)
	plant := map[string]string{
		"handle/planted.go":          "package handle\n\nimport _ \"github.com/queen-locks/queen-locks/internal/testcert\"\n",
		"permit/gatedpod/planted.go": "package gatedpod\n\nimport _ \"github.com/queen-locks/queen-locks/locks\"\n",
	}
	for f, src := range plant {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	cmd := exec.Command(lint, "run", "--enable-only", "depguard", "--allow-parallel-runners",
		"--output.json.path", "stdout", "--show-stats=false",
		"./handle/...", "./permit/...", "./locks/...", "./routeapi/...", "./api/...")
	cmd.Dir = dir
	// The copy has no .git: go must not stamp VCS information. Other
	// runs of the linter (make lint) may go on at the same time.
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err == nil {
		t.Fatalf("golangci-lint passed a tree with imports that break the layering:\n%s", stdout.String())
	}
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("golangci-lint did not run (%v):\n%s\n%s", err, stderr.String(), stdout.String())
	}

	var out struct {
		Issues []struct {
			FromLinter string
			Text       string
			Pos        struct{ Filename string }
		}
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("golangci-lint's JSON: %v\n%s", err, stdout.String())
	}
	found := map[string]bool{}
	for _, is := range out.Issues {
		f := filepath.ToSlash(is.Pos.Filename)
		if _, ok := plant[f]; !ok || is.FromLinter != "depguard" {
			t.Errorf("unexpected finding (the tree as it is must pass): %s %s: %s", is.FromLinter, f, is.Text)
			continue
		}
		found[f] = true
		t.Logf("%s: %s", f, is.Text)
	}
	for f := range plant {
		if !found[f] {
			t.Errorf("depguard did not fail the planted import in %s", f)
		}
	}
}
