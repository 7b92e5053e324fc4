package clients_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/routeapi"
)

// The C++ handle (clients/cpp) is built once per run, with CMake, into a
// directory under the run's temporary directory: both tests below use it,
// and nothing lands in the source tree.
var cppBuilt struct {
	once sync.Once
	dir  string
	err  error
}

func cppBuild(t *testing.T) string {
	t.Helper()
	cppBuilt.once.Do(func() {
		dir := filepath.Join(tmp, "cpp-build")
		for _, argv := range [][]string{
			{"cmake", "-S", "clients/cpp", "-B", dir, "-DCMAKE_BUILD_TYPE=Debug"},
			// Two jobs: the machine's cores are shared.
			{"cmake", "--build", dir, "--parallel", "2"},
		} {
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Dir = root
			start := time.Now()
			out, err := cmd.CombinedOutput()
			t.Logf("$ %s (%s)", strings.Join(argv, " "), time.Since(start).Round(time.Second))
			if err != nil {
				cppBuilt.err = fmt.Errorf("%s: %w (hack/handles/cpp.sh installs what it needs)\n%s", strings.Join(argv, " "), err, out)
				return
			}
		}
		cppBuilt.dir = dir
	})
	if cppBuilt.err != nil {
		t.Fatal(cppBuilt.err)
	}
	return cppBuilt.dir
}

func TestCppHandle(t *testing.T) {
	dir := cppBuild(t)
	// One test at a time: the checkpoint test counts the API server's writes.
	argv := append([]string{"ctest", "--test-dir", dir, "--output-on-failure", "--no-tests=error"}, only("-R")...)
	out := runTests(t, "cpp", argv...)
	// With the route given, nothing may be skipped or disabled: either would
	// hide a test that never ran.
	if only("") == nil && regexp.MustCompile(`\((Skipped|Disabled|Not Run)\)|tests did not run`).MatchString(out) {
		t.Fatal("ctest did not run every test with the route given (see above)")
	}
	m := regexp.MustCompile(`(?m)^100% tests passed, 0 tests failed out of (\d+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("ctest printed no summary of passed tests")
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 {
		t.Fatal("ctest ran no tests")
	}
}

// cppScriptParty is a party of the agreement test that runs a holder
// program: the C++ one (clients/cpp/tests/holder.cpp) or another language's.
// Each prints one JSON line of what it saw; hold keeps the lock until its
// stdin closes.
func cppScriptParty(environ []string, url, name string, argv ...string) party {
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

// A lock held by the C++ handle is seen as held by the Go handle, the CLI,
// and the Python and JavaScript handles; and one held by any of them is seen
// as held by the C++ handle.
func TestCppHandleAgreesWithTheOthers(t *testing.T) {
	dir := cppBuild(t)
	url, ns, environ := testEnv(t, "cpp-agree")
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

	cpp := cppScriptParty(environ, url, "cpp", filepath.Join(dir, "queen-locks-holder"))
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
		cppScriptParty(environ, url, "python", "python3", "clients/python/tests/holder.py"),
		cppScriptParty(environ, url, "node", "node", "clients/js/testing/holder.js"),
	}

	// sees checks that other saw lock held by holder, as got.
	sees := func(t *testing.T, holder, other party, lock string, got seen) {
		t.Helper()
		s := other.try(t, lock)
		if s.Acquired || s.Reason != "held" || len(s.Holders) != 1 ||
			s.Holders[0].Owner != got.Owner || s.Holders[0].Token < got.Token {
			// Not equal: a holder that renews may have changed the token
			// since its acquire answered.
			t.Errorf("%s saw %+v; %s holds it as %s with token %d", other.name, s, holder.name, got.Owner, got.Token)
		}
	}
	free := func(t *testing.T, holder party, lock string) {
		t.Helper()
		after := goClient.Lock(lock, time.Minute)
		if ok, err := after.Acquire(ctx); err != nil || !ok {
			t.Fatalf("after %s released, the lock is not free: %v %v", holder.name, ok, err)
		}
		_ = after.Release(ctx)
	}

	t.Run("held by cpp", func(t *testing.T) {
		lock := "agree-cpp"
		got, release := cpp.hold(t, lock)
		if !got.Acquired || got.Owner == "" || got.Token == 0 {
			t.Fatalf("cpp did not acquire a free lock: %+v", got)
		}
		for _, other := range others {
			sees(t, cpp, other, lock, got)
		}
		release()
		free(t, cpp, lock)
	})
	for _, holder := range others {
		t.Run("cpp sees it held by "+holder.name, func(t *testing.T) {
			lock := "agree-cpp-" + holder.name
			got, release := holder.hold(t, lock)
			if !got.Acquired || got.Owner == "" || got.Token == 0 {
				t.Fatalf("%s did not acquire a free lock: %+v", holder.name, got)
			}
			sees(t, holder, cpp, lock, got)
			release()
			free(t, holder, lock)
		})
	}
}
