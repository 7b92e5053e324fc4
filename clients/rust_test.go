package clients_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
)

// rustCargo is the cargo to build with: $CARGO, else the one on PATH, else
// rustup's default place.
func rustCargo(t *testing.T) string {
	t.Helper()
	if c := os.Getenv("CARGO"); c != "" {
		return c
	}
	if c, err := exec.LookPath("cargo"); err == nil {
		return c
	}
	if home, err := os.UserHomeDir(); err == nil {
		if c := filepath.Join(home, ".cargo", "bin", "cargo"); rustFileExists(c) {
			return c
		}
	}
	t.Fatal("no cargo: set CARGO, put cargo on PATH, or run hack/handles/rust.sh")
	return ""
}

func rustFileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// rustCargoArgv runs cargo in clients/rust: cargo reads .cargo/config.toml
// (build from Debian's packaged crates, offline) from the directory it runs
// in, not from the manifest's.
func rustCargoArgv(cargo string, args ...string) []string {
	return append([]string{"sh", "-c", `cd clients/rust && exec "$@"`, "sh", cargo}, args...)
}

var rustResult = regexp.MustCompile(`(?m)^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored; (\d+) measured; (\d+) filtered out`)

func TestRustHandle(t *testing.T) {
	args := []string{"test", "--offline"}
	narrowed := os.Getenv("QUEEN_LOCKS_CLIENT_TESTS") != ""
	if narrowed {
		args = append(args, "--", os.Getenv("QUEEN_LOCKS_CLIENT_TESTS"))
	}
	out := runTests(t, "rust", rustCargoArgv(rustCargo(t), args...)...)
	var passed, ignored, filtered int
	results := rustResult.FindAllStringSubmatch(out, -1)
	for _, m := range results {
		p, _ := strconv.Atoi(m[1])
		i, _ := strconv.Atoi(m[3])
		f, _ := strconv.Atoi(m[5])
		passed, ignored, filtered = passed+p, ignored+i, filtered+f
	}
	if len(results) == 0 || passed == 0 {
		t.Fatalf("cargo test passed no tests (%d result lines)", len(results))
	}
	// With the route given, nothing may be left out: an ignored test is
	// one that never ran.
	if ignored != 0 || (filtered != 0 && !narrowed) {
		t.Fatalf("cargo test ignored %d and filtered out %d tests", ignored, filtered)
	}
	t.Logf("cargo test: %d passed in %d test binaries", passed, len(results))
}

// rustHolder builds the Rust holder program (clients/rust/examples/holder.rs)
// and answers its path.
func rustHolder(t *testing.T) string {
	t.Helper()
	argv := rustCargoArgv(rustCargo(t), "build", "--offline", "--example", "holder", "--message-format=json-render-diagnostics")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("building the Rust holder: %v\n%s", err, stderr.String())
	}
	for _, line := range bytes.Split(out, []byte("\n")) {
		var m struct {
			Reason string `json:"reason"`
			Target struct {
				Name string   `json:"name"`
				Kind []string `json:"kind"`
			} `json:"target"`
			Executable string `json:"executable"`
		}
		if json.Unmarshal(line, &m) == nil && m.Reason == "compiler-artifact" && m.Target.Name == "holder" && m.Executable != "" {
			return m.Executable
		}
	}
	t.Fatalf("cargo built no holder executable: %s", out)
	return ""
}
