package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

// syncBuffer is a process's stderr that the test reads while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// heldBy lists the owners of the permits of ns, read from the API server.
func heldBy(t *testing.T, ns string) []string {
	t.Helper()
	var list locksv1alpha1.QueenLockList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var owners []string
	for _, p := range list.Items {
		owners = append(owners, p.Spec.Owner)
	}
	return owners
}

func holds(t *testing.T, ns, owner string) bool {
	t.Helper()
	for _, o := range heldBy(t, ns) {
		if o == owner {
			return true
		}
	}
	return false
}

// SIGTERM and SIGINT while queenlock waits for a held lock: it stops
// waiting, exits 128+N without running the command, and holds nothing.
func TestSignalWhileWaitingLeavesNothingHeld(t *testing.T) {
	where(t, func(t *testing.T, ns string, conn []string) {
		if out, err := cmd("acquire", "busy", conn, "--ttl", "60s", "--owner", "holder").CombinedOutput(); err != nil {
			t.Fatalf("acquire: %v %s", err, out)
		}
		for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
			marker := filepath.Join(t.TempDir(), "ran")
			c := cmd("run", "busy", conn, "--ttl", "30s", "--wait", "60s", "--owner", "waiter", "--", "touch", marker)
			var stderr syncBuffer
			c.Stderr = &stderr
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			eventually(t, "queenlock to wait", func() bool { return strings.Contains(stderr.String(), "waiting up to") })
			if err := c.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			code := exitCode(c.Wait())
			if code != 128+int(sig) || exists(marker) || !strings.Contains(stderr.String(), "the lock is not held") {
				t.Fatalf("%v: exit %d, ran %v, stderr %q", sig, code, exists(marker), stderr.String())
			}
			if holds(t, ns, "waiter") {
				t.Fatalf("%v: the waiter holds a permit after exiting", sig)
			}
		}
	})
}

// The lock frees at the moment the waiter is told to stop: whichever comes
// first, the waiter leaves nothing held.
func TestSignalAsTheLockFreesLeavesNothingHeld(t *testing.T) {
	where(t, func(t *testing.T, ns string, conn []string) {
		for i := range 3 {
			out, err := cmd("acquire", "racy", conn, "--ttl", "60s", "--owner", "holder").Output()
			if err != nil {
				t.Fatalf("acquire: %v %s", err, out)
			}
			token := jsonToken(t, out)
			c := cmd("run", "racy", conn, "--ttl", "30s", "--wait", "60s", "--owner", "waiter", "--", "sleep", "30")
			var stderr syncBuffer
			c.Stderr = &stderr
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			eventually(t, "queenlock to wait", func() bool { return strings.Contains(stderr.String(), "waiting up to") })
			if out, err := cmd("release", "racy", conn, "--token", token, "--owner", "holder").CombinedOutput(); err != nil {
				t.Fatalf("release: %v %s", err, out)
			}
			_ = c.Process.Signal(syscall.SIGTERM)
			// Either it had not run sleep (stopped by SIGTERM), or sleep got
			// the SIGTERM passed on: 143 both ways.
			if code := exitCode(c.Wait()); code != 143 {
				t.Fatalf("round %d: exit %d: %s", i, code, stderr.String())
			}
			if holds(t, ns, "waiter") {
				t.Fatalf("round %d: the waiter holds a permit after exiting: %s", i, stderr.String())
			}
		}
	})
}

// A signal while CMD runs goes to CMD; queenlock exits with CMD's status and
// has released the lock by then.
func TestSignalWhileTheCommandRunsIsPassedOn(t *testing.T) {
	where(t, func(t *testing.T, ns string, conn []string) {
		for _, tc := range []struct {
			name   string
			sig    syscall.Signal
			script string // {dir} is replaced by a directory of the test
			grace  string
			want   int
		}{
			{"SIGTERM trapped", syscall.SIGTERM, `trap 'echo TERM > {dir}/got; exit 7' TERM`, "10s", 7},
			{"SIGINT trapped", syscall.SIGINT, `trap 'echo INT > {dir}/got; exit 8' INT`, "10s", 8},
			{"SIGTERM kills", syscall.SIGTERM, ``, "10s", 143},
			// A command that ignores SIGTERM is killed after --grace, so
			// queenlock still releases before its own killer gives up.
			{"SIGTERM ignored", syscall.SIGTERM, `trap '' TERM`, "1s", 137},
		} {
			t.Run(tc.name, func(t *testing.T) {
				dir := t.TempDir()
				script := strings.ReplaceAll(tc.script, "{dir}", dir) + "\ntouch " + dir + "/started; while :; do sleep 0.05; done"
				c := cmd("run", "worker", conn, "--ttl", "30s", "--grace", tc.grace, "--owner", "runner", "--", "sh", "-c", script)
				var stderr syncBuffer
				c.Stderr = &stderr
				if err := c.Start(); err != nil {
					t.Fatal(err)
				}
				eventually(t, "the command to start", func() bool { return exists(filepath.Join(dir, "started")) })
				if !holds(t, ns, "runner") {
					t.Fatal("the command runs without the permit stored")
				}
				if err := c.Process.Signal(tc.sig); err != nil {
					t.Fatal(err)
				}
				code := exitCode(c.Wait())
				if code != tc.want {
					t.Fatalf("exit %d, want %d: %s", code, tc.want, stderr.String())
				}
				if tc.script != "" && tc.want < 128 && !exists(filepath.Join(dir, "got")) {
					t.Fatal("the command did not see the signal")
				}
				if holds(t, ns, "runner") {
					t.Fatal("the permit is still held after queenlock exited")
				}
			})
		}
	})
}

// As a container's PID 1 (here: the first process of a new PID namespace)
// a process gets only the signals it has handlers for. queenlock installs
// its own from the start, so SIGTERM still stops a wait, reaches CMD, and
// the lock is released.
func TestSignalsReachQueenlockAsPID1(t *testing.T) {
	if err := exec.Command("unshare", "--pid", "--fork", "--kill-child", "true").Run(); err != nil {
		t.Skipf("cannot make a PID namespace here: %v", err)
	}
	ns := namespace(t)
	conn := []string{"--kubeconfig", kubeconfig, "-n", ns}
	// init starts queenlock as PID 1 of a new namespace and answers the
	// unshare process and queenlock's PID as seen from here.
	init := func(args ...string) (*exec.Cmd, *syncBuffer, func() int) {
		c := exec.Command("unshare", append([]string{"--pid", "--fork", "--kill-child", queenlock}, args...)...)
		c.Env = append(os.Environ(), "QUEEN_LOCKS_URL=")
		stderr := &syncBuffer{}
		c.Stderr = stderr
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		return c, stderr, func() int {
			// unshare's only child.
			b, err := os.ReadFile("/proc/" + strconv.Itoa(c.Process.Pid) + "/task/" + strconv.Itoa(c.Process.Pid) + "/children")
			if err != nil || len(strings.Fields(string(b))) != 1 {
				t.Fatalf("children of unshare: %q %v", b, err)
			}
			pid, _ := strconv.Atoi(strings.Fields(string(b))[0])
			return pid
		}
	}

	t.Run("while CMD runs", func(t *testing.T) {
		dir := t.TempDir()
		script := `trap 'echo TERM > ` + dir + `/got; exit 7' TERM; echo $PPID > ` + dir + `/ppid; while :; do sleep 0.05; done`
		c, stderr, pid := init(append(append([]string{"run", "pid1"}, conn...), "--ttl", "30s", "--owner", "init", "--", "sh", "-c", script)...)
		eventually(t, "the command to start", func() bool { return exists(filepath.Join(dir, "ppid")) })
		// The command's parent, queenlock, is PID 1 of the namespace.
		if b, _ := os.ReadFile(filepath.Join(dir, "ppid")); strings.TrimSpace(string(b)) != "1" {
			t.Fatalf("queenlock's PID in the namespace is %q, want 1", b)
		}
		if err := syscall.Kill(pid(), syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := exitCode(c.Wait()); code != 7 || !exists(filepath.Join(dir, "got")) {
			t.Fatalf("exit %d, command saw SIGTERM %v: %s", code, exists(filepath.Join(dir, "got")), stderr.String())
		}
		if holds(t, ns, "init") {
			t.Fatal("the permit is still held after queenlock exited")
		}
	})
	t.Run("while waiting", func(t *testing.T) {
		if out, err := cmd("acquire", "pid1-held", conn, "--ttl", "60s", "--owner", "holder").CombinedOutput(); err != nil {
			t.Fatalf("acquire: %v %s", err, out)
		}
		marker := filepath.Join(t.TempDir(), "ran")
		c, stderr, pid := init(append(append([]string{"run", "pid1-held"}, conn...), "--ttl", "30s", "--wait", "60s", "--owner", "init-waiter", "--", "touch", marker)...)
		eventually(t, "queenlock to wait", func() bool { return strings.Contains(stderr.String(), "waiting up to") })
		if err := syscall.Kill(pid(), syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := exitCode(c.Wait()); code != 143 || exists(marker) || !strings.Contains(stderr.String(), "the lock is not held") {
			t.Fatalf("exit %d, ran %v: %s", code, exists(marker), stderr.String())
		}
		if holds(t, ns, "init-waiter") {
			t.Fatal("the waiter holds a permit after exiting")
		}
	})
}

// jsonToken is the token of a queenlock acquire's JSON answer.
func jsonToken(t *testing.T, out []byte) string {
	t.Helper()
	var r map[string]any
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	tok, ok := r["token"].(float64)
	if !ok {
		t.Fatalf("no token in %s", out)
	}
	return strconv.FormatFloat(tok, 'f', 0, 64)
}
