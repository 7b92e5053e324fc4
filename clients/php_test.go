package clients_test

// The PHP handle's own tests (PHPUnit) against the real route, and its
// agreement with the Go handle, the CLI and the Python and JavaScript
// handles on who holds a lock.

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os/exec"
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

func TestPHPHandle(t *testing.T) {
	out := runTests(t, "php", append([]string{"phpunit", "--configuration", "clients/php/phpunit.xml", "--testdox",
		"--fail-on-skipped", "--fail-on-incomplete", "--fail-on-risky", "--fail-on-warning"}, only("--filter")...)...)
	// With the route given nothing may be skipped, left incomplete or be
	// risky (a test that asserted nothing): each would hide a test that did
	// not run. PHPUnit 9 says so in its summary.
	if regexp.MustCompile(`(?m)^OK, but|(Skipped|Incomplete|Risky|Warnings): \d+`).MatchString(out) && only("") == nil {
		t.Fatal("phpunit skipped tests, left them incomplete or found them risky with the route given (see its summary above)")
	}
	m := regexp.MustCompile(`(?m)^OK \((\d+) tests?, \d+ assertions?\)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("phpunit printed no OK summary")
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 {
		t.Fatal("phpunit ran no tests")
	}
}

// A lock held by the PHP handle is seen as held, with its owner and token,
// by the Go handle, the CLI, and the Python and JavaScript handles; a lock
// held by any of those is seen as held by the PHP handle.
func TestPHPHandleAgreesWithTheOtherHandles(t *testing.T) {
	url, ns, environ := testEnv(t, "php-agree")
	base := strings.TrimSuffix(url, route.Path)
	ctx := context.Background()
	goClient := handle.New(handle.HTTP(url, handle.HTTPOptions{Namespace: ns}))

	// A holder script of one of the languages: hold a lock until its stdin
	// closes, or try one once.
	script := func(argv ...string) party {
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
			name: argv[0],
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

	php := script("php", "clients/php/testing/holder.php")
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
		script("python3", "clients/python/tests/holder.py"),
		script("node", "clients/js/testing/holder.js"),
	}

	// sees checks that other, trying lock, finds it held by holder alone.
	sees := func(t *testing.T, other party, lock, holder string, got seen) {
		t.Helper()
		s := other.try(t, lock)
		if s.Acquired || s.Reason != "held" || len(s.Holders) != 1 ||
			s.Holders[0].Owner != got.Owner || s.Holders[0].Token < got.Token {
			// Not equal: a holder's renew may have changed the token since
			// its acquire answered.
			t.Errorf("%s saw %+v; %s holds it as %s with token %d", other.name, s, holder, got.Owner, got.Token)
		}
	}
	// freed checks that lock is free again once holder released it.
	freed := func(t *testing.T, lock, holder string) {
		t.Helper()
		after := goClient.Lock(lock, time.Minute)
		if ok, err := after.Acquire(ctx); err != nil || !ok {
			t.Fatalf("after %s released, the lock is not free: %v %v", holder, ok, err)
		}
		_ = after.Release(ctx)
	}

	t.Run("held by php", func(t *testing.T) {
		lock := "php-agree-php"
		got, release := php.hold(t, lock)
		if !got.Acquired || got.Owner == "" || got.Token == 0 {
			t.Fatalf("php did not acquire a free lock: %+v", got)
		}
		for _, other := range others {
			sees(t, other, lock, "php", got)
		}
		release()
		freed(t, lock, "php")
	})
	for _, holder := range others {
		t.Run("held by "+holder.name+", seen by php", func(t *testing.T) {
			lock := "php-agree-" + strings.TrimSuffix(holder.name, "3")
			got, release := holder.hold(t, lock)
			if !got.Acquired || got.Owner == "" || got.Token == 0 {
				t.Fatalf("%s did not acquire a free lock: %+v", holder.name, got)
			}
			sees(t, php, lock, holder.name, got)
			release()
			freed(t, lock, holder.name)
		})
	}
}
