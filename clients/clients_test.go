// Package clients_test runs each handle's own tests in its own runner
// (unittest, node --test, cargo test, PHPUnit, CTest) against the real
// route of a local control plane, and checks that the CLI and every handle
// agree on who holds a lock.
package clients_test

import (
	"bufio"
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
	"syscall"
	"testing"
	"time"

	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/routeapi"
)

// testEnv is what a language's tests need to find the route, in a fresh
// namespace with its own route.
func testEnv(t *testing.T, lang string) (url, ns string, environ []string) {
	t.Helper()
	ns = env.Namespace(t, lang)
	url, _ = env.ServeRoute(t, route.AuthNone, ns)
	environ = append(os.Environ(),
		"QUEEN_LOCKS_TEST_URL="+url,
		"QUEEN_LOCKS_TEST_NAMESPACE="+ns,
		"QUEEN_LOCKS_TEST_KUBECONFIG="+kubeconfig,
		"QUEEN_LOCKS_TEST_KUBECTL="+kubectl,
		"QUEEN_LOCKS_TEST_TLS_DIR="+tlsDir,
		// The handles must take the route from their arguments, and no
		// token from this machine.
		"QUEEN_LOCKS_URL=",
		"QUEEN_LOCKS_TOKEN_FILE=",
		// Keep __pycache__ out of the source tree.
		"PYTHONDONTWRITEBYTECODE=1",
	)
	return url, ns, environ
}

// runTests runs a language's test runner in the module's root and fails
// when it fails; its output is always logged.
func runTests(t *testing.T, lang string, argv ...string) string {
	t.Helper()
	_, _, environ := testEnv(t, lang)
	ctx, cancel := context.WithTimeout(context.Background(), runnerTimeout())
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = root, environ
	// node --test runs each file in a process of its own: on a timeout, end
	// the whole group, and do not wait for its pipes forever.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	t.Logf("$ %s\n%s", strings.Join(argv, " "), out)
	if err != nil {
		t.Fatalf("%s: %v (its output is above)", strings.Join(argv, " "), err)
	}
	return string(out)
}

// runnerTimeout bounds a runner: QUEEN_LOCKS_RUNNER_TIMEOUT (a duration), or
// 10 minutes.
func runnerTimeout() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("QUEEN_LOCKS_RUNNER_TIMEOUT")); err == nil {
		return d
	}
	return 10 * time.Minute
}

// only narrows the runners to the tests whose names contain
// QUEEN_LOCKS_CLIENT_TESTS, when set: for working on one test.
func only(flag string) []string {
	if p := os.Getenv("QUEEN_LOCKS_CLIENT_TESTS"); p != "" {
		return []string{flag, p}
	}
	return nil
}

func TestPythonHandle(t *testing.T) {
	out := runTests(t, "python", append([]string{"python3", "-m", "unittest", "discover", "-s", "clients/python/tests", "-v"}, only("-k")...)...)
	// With the route given, nothing may be skipped: a skip would hide a test
	// that never ran.
	if m := regexp.MustCompile(`skipped=\d+`).FindString(out); m != "" && only("") == nil {
		t.Fatalf("unittest %s with the route given", m)
	}
	if !regexp.MustCompile(`(?m)^Ran [1-9]\d* tests`).MatchString(out) {
		t.Fatal("unittest ran no tests")
	}
}

// The package installs with plain pip and nothing from a package index
// (the build backend is in-tree, standard library only), and imports from
// where it was installed.
func TestPythonPackageInstallsWithPip(t *testing.T) {
	target := t.TempDir()
	install := exec.Command("python3", "-m", "pip", "install", "--quiet", "--target", target, "./clients/python")
	install.Dir = root
	install.Env = append(os.Environ(), "PIP_NO_INDEX=1", "PIP_DISABLE_PIP_VERSION_CHECK=1", "PYTHONDONTWRITEBYTECODE=1")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("pip install ./clients/python: %v: %s", err, out)
	}
	check := exec.Command("python3", "-c", "import queen_locks, sys; print(queen_locks.__file__); queen_locks.Client('http://127.0.0.1:1').lock('x', 30)")
	check.Dir = target
	check.Env = append(os.Environ(), "PYTHONPATH="+target, "PYTHONDONTWRITEBYTECODE=1")
	out, err := check.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), target) {
		t.Fatalf("importing the installed package: %v: %s", err, out)
	}
}

func TestJavaScriptHandle(t *testing.T) {
	out := runTests(t, "js", append([]string{"node", "--test", "--test-reporter=spec"}, append(only("--test-name-pattern"), "clients/js/test/")...)...)
	count := func(what string) int {
		m := regexp.MustCompile(`(?m)^ℹ ` + what + ` (\d+)$`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("node --test printed no %q count", what)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	// A skipped suite counts no skipped tests: look for the spec reporter's
	// mark of a skip too.
	if n := count("skipped"); (n != 0 || strings.Contains(out, "﹣")) && only("") == nil {
		t.Fatalf("node --test skipped tests or suites with the route given (see ﹣ above)")
	}
	if count("pass") == 0 {
		t.Fatal("node --test passed no tests")
	}
}

// seen is what one party saw when it tried a lock.
type seen struct {
	Acquired bool              `json:"acquired"`
	Owner    string            `json:"owner"`
	Token    uint64            `json:"token"`
	Reason   string            `json:"reason"`
	Holders  []routeapi.Holder `json:"holders"`
}

// party holds locks and tries them in one of the four ways.
type party struct {
	name string
	// hold acquires lock and keeps it until release is called.
	hold func(t *testing.T, lock string) (got seen, release func())
	// try acquires lock once, and releases it again if it got it.
	try func(t *testing.T, lock string) seen
}

func TestEveryHandleSeesTheOthersLocks(t *testing.T) {
	url, ns, environ := testEnv(t, "agree")
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

	parties := []party{
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
		scriptParty(url, environ, "python", "python3", "clients/python/tests/holder.py"),
		scriptParty(url, environ, "javascript", "node", "clients/js/testing/holder.js"),
		scriptParty(url, environ, "rust", rustHolder(t)),
		scriptParty(url, environ, "php", "php", "clients/php/testing/holder.php"),
		scriptParty(url, environ, "cpp", filepath.Join(cppBuild(t), "queen-locks-holder")),
	}

	for _, holder := range parties {
		t.Run("held by "+holder.name, func(t *testing.T) {
			lock := "agree-" + holder.name
			got, release := holder.hold(t, lock)
			if !got.Acquired || got.Owner == "" || got.Token == 0 {
				t.Fatalf("%s did not acquire a free lock: %+v", holder.name, got)
			}
			for _, other := range parties {
				if other.name == holder.name {
					continue
				}
				s := other.try(t, lock)
				if s.Acquired || s.Reason != "held" || len(s.Holders) != 1 ||
					s.Holders[0].Owner != got.Owner || s.Holders[0].Token < got.Token {
					// Not equal: the holder's background renew may have
					// changed the token since its acquire answered.
					t.Errorf("%s saw %+v; %s holds it as %s with token %d", other.name, s, holder.name, got.Owner, got.Token)
				}
			}
			release()
			after := goClient.Lock(lock, time.Minute)
			if ok, err := after.Acquire(ctx); err != nil || !ok {
				t.Fatalf("after %s released, the lock is not free: %v %v", holder.name, ok, err)
			}
			_ = after.Release(ctx)
		})
	}
}

// scriptParty is a party played by a holder program of one of the
// languages (clients/python/tests/holder.py says what one does): hold a
// lock until its stdin closes, or try one once.
func scriptParty(url string, environ []string, name string, argv ...string) party {
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
			t.Fatalf("%s %s %s: %v: %q; stderr: %s", strings.Join(argv, " "), mode, lock, err, line, cmd.Stderr)
		}
		return cmd, stdin, s
	}
	wait := func(t *testing.T, cmd *exec.Cmd) {
		t.Helper()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("%s: %v; stderr: %s", strings.Join(cmd.Args, " "), err, cmd.Stderr)
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
