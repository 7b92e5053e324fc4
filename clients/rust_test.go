package clients_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/routeapi"
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

// rustScript is a party played by a holder program (see holder.py).
func rustScript(url string, environ []string, name string, argv ...string) party {
	start := func(t *testing.T, mode, lock string) (*exec.Cmd, io.WriteCloser, seen) {
		t.Helper()
		cmd := exec.Command(argv[0], append(argv[1:], mode, lock)...)
		cmd.Dir = root
		cmd.Env = append(slices.Clip(environ), "QUEEN_LOCKS_URL="+url)
		cmd.Stderr = &strings.Builder{}
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var s seen
		line, err := bufio.NewReader(stdout).ReadBytes('\n')
		if err == nil {
			err = json.Unmarshal(line, &s)
		}
		if err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("%s %s %s: %v: %q; stderr: %s", name, mode, lock, err, line, cmd.Stderr)
		}
		return cmd, stdin, s
	}
	wait := func(t *testing.T, cmd *exec.Cmd) {
		t.Helper()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("%s: %v; stderr: %s", name, err, cmd.Stderr)
		}
	}
	return party{
		name: name,
		hold: func(t *testing.T, lock string) (seen, func()) {
			t.Helper()
			cmd, stdin, s := start(t, "hold", lock)
			return s, func() { _ = stdin.Close(); wait(t, cmd) }
		},
		try: func(t *testing.T, lock string) seen {
			t.Helper()
			cmd, stdin, s := start(t, "try", lock)
			_ = stdin.Close()
			wait(t, cmd)
			return s
		},
	}
}

// TestRustHandleAgreesWithTheOthers: a lock the Rust handle holds is held
// for the Go handle, the CLI, Python and JavaScript; and a lock any of them
// holds is held for the Rust handle.
func TestRustHandleAgreesWithTheOthers(t *testing.T) {
	holder := rustHolder(t)
	url, ns, environ := testEnv(t, "rust-agree")
	base := strings.TrimSuffix(url, route.Path)
	ctx := context.Background()
	goClient := handle.New(handle.HTTP(url, handle.HTTPOptions{Namespace: ns}))

	cli := func(t *testing.T, args ...string) routeapi.Result {
		t.Helper()
		cmd := exec.Command(queenlock, append(args, "--server", base, "-n", ns)...)
		cmd.Env = environ
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var r routeapi.Result
		if jerr := json.Unmarshal(out, &r); jerr != nil {
			t.Fatalf("queenlock %s: %v, %v: %s %s", strings.Join(args, " "), err, jerr, out, stderr.String())
		}
		return r
	}
	rust := rustScript(url, environ, "rust", holder)
	others := []party{
		{
			name: "go",
			hold: func(t *testing.T, lock string) (seen, func()) {
				t.Helper()
				h := goClient.Lock(lock, 30*time.Second)
				ok, err := h.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return seen{Acquired: ok, Owner: h.Owner(), Token: h.Token()}, func() {
					if err := h.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
			},
			try: func(t *testing.T, lock string) seen {
				t.Helper()
				h := goClient.Lock(lock, 30*time.Second)
				ok, err := h.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				s := seen{Acquired: ok, Owner: h.Owner(), Reason: h.Reason()}
				for _, hd := range h.Holders() {
					s.Holders = append(s.Holders, routeapi.Holder{Slot: hd.Slot, Owner: hd.Owner, Token: hd.Token})
				}
				if ok {
					_ = h.Release(ctx)
				}
				return s
			},
		},
		{
			name: "queenlock",
			hold: func(t *testing.T, lock string) (seen, func()) {
				t.Helper()
				r := cli(t, "acquire", lock, "--ttl", "30s")
				s := seen{Acquired: r.Acquired != nil && *r.Acquired, Owner: r.Owner}
				if r.Token != nil {
					s.Token = *r.Token
				}
				return s, func() {
					if r := cli(t, "release", lock, "--token", strconv.FormatUint(s.Token, 10), "--owner", s.Owner); r.Released == nil || !*r.Released {
						t.Fatalf("queenlock release: %+v", r)
					}
				}
			},
			try: func(t *testing.T, lock string) seen {
				t.Helper()
				r := cli(t, "acquire", lock, "--ttl", "30s")
				s := seen{Acquired: r.Acquired != nil && *r.Acquired, Owner: r.Owner, Reason: r.Reason}
				if r.Holders != nil {
					s.Holders = *r.Holders
				}
				if s.Acquired {
					cli(t, "release", lock, "--token", strconv.FormatUint(*r.Token, 10), "--owner", r.Owner)
				}
				return s
			},
		},
		rustScript(url, environ, "python", "python3", "clients/python/tests/holder.py"),
		rustScript(url, environ, "javascript", "node", "clients/js/testing/holder.js"),
	}

	// seesHeld fails unless s is a refusal naming got as the only holder.
	seesHeld := func(t *testing.T, who string, s seen, by string, got seen) {
		t.Helper()
		if s.Acquired || s.Reason != "held" || len(s.Holders) != 1 ||
			s.Holders[0].Owner != got.Owner || s.Holders[0].Token < got.Token {
			// Not equal: the holder's background renew may have changed
			// the token since its acquire answered.
			t.Errorf("%s saw %+v; %s holds it as %s with token %d", who, s, by, got.Owner, got.Token)
		}
	}
	free := func(t *testing.T, lock, after string) {
		t.Helper()
		h := goClient.Lock(lock, time.Minute)
		if ok, err := h.Acquire(ctx); err != nil || !ok {
			t.Fatalf("after %s released, the lock is not free: %v %v", after, ok, err)
		}
		_ = h.Release(ctx)
	}

	t.Run("held by rust", func(t *testing.T) {
		lock := "agree-rust"
		got, release := rust.hold(t, lock)
		if !got.Acquired || got.Owner == "" || got.Token == 0 {
			t.Fatalf("rust did not acquire a free lock: %+v", got)
		}
		if parts := strings.Split(got.Owner, ":"); len(parts) < 3 {
			t.Errorf("rust's owner %q is not host:pid:random", got.Owner)
		}
		for _, other := range others {
			seesHeld(t, other.name, other.try(t, lock), "rust", got)
		}
		release()
		free(t, lock, "rust")
	})
	for _, holder := range others {
		t.Run("held by "+holder.name, func(t *testing.T) {
			lock := "agree-rust-" + holder.name
			got, release := holder.hold(t, lock)
			if !got.Acquired || got.Owner == "" || got.Token == 0 {
				t.Fatalf("%s did not acquire a free lock: %+v", holder.name, got)
			}
			seesHeld(t, "rust", rust.try(t, lock), holder.name, got)
			release()
			free(t, lock, holder.name)
		})
	}
}
