package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

func namespace(t *testing.T) string {
	t.Helper()
	return env.Namespace(t, "cli")
}

// where runs f over the route and over the Kubernetes API: conn are the
// flags that point queenlock at the locks of ns.
func where(t *testing.T, f func(t *testing.T, ns string, conn []string)) {
	t.Helper()
	t.Run("route", func(t *testing.T) {
		ns := namespace(t)
		f(t, ns, []string{"--server", startRoute(t, ns)})
	})
	t.Run("kube", func(t *testing.T) {
		ns := namespace(t)
		f(t, ns, []string{"--kubeconfig", kubeconfig, "-n", ns})
	})
}

// cmd builds a queenlock command: queenlock SUB NAME conn... args...
func cmd(sub, name string, conn []string, args ...string) *exec.Cmd {
	a := append([]string{sub, name}, conn...)
	c := exec.Command(queenlock, append(a, args...)...)
	c.Env = append(os.Environ(), "QUEEN_LOCKS_URL=")
	return c
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 60*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

func TestRunOnceAtATime(t *testing.T) {
	where(t, func(t *testing.T, ns string, conn []string) {
		dir := t.TempDir()
		// The winner runs until told to stop, so the others find it held.
		script := `echo ran >> ` + dir + `/ran; while [ ! -f ` + dir + `/stop ]; do sleep 0.05; done`
		var procs []*exec.Cmd
		var stderr [4]bytes.Buffer
		for i := range 4 {
			c := cmd("run", "nightly", conn, "--ttl", "30s", "--", "sh", "-c", script)
			c.Stderr = &stderr[i]
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			procs = append(procs, c)
		}
		codes := make([]int, 4)
		var wg sync.WaitGroup
		var mu sync.Mutex
		exited := 0
		for i, c := range procs {
			wg.Go(func() {
				err := c.Wait()
				mu.Lock()
				codes[i] = exitCode(err)
				exited++
				mu.Unlock()
			})
		}
		eventually(t, "three skipped runs", func() bool { mu.Lock(); defer mu.Unlock(); return exited == 3 })
		if err := os.WriteFile(filepath.Join(dir, "stop"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		ran, _ := os.ReadFile(filepath.Join(dir, "ran"))
		if n := strings.Count(string(ran), "ran"); n != 1 {
			t.Fatalf("the command ran %d times", n)
		}
		for i, code := range codes {
			if code != 0 {
				t.Errorf("run %d exited %d: %s", i, code, stderr[i].String())
			}
		}
		var list locksv1alpha1.QueenLockList
		if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil || len(list.Items) != 0 {
			t.Fatalf("permits left after the runs: %v %v", list.Items, err)
		}
	})
}

func TestRunSemaphoreWaits(t *testing.T) {
	where(t, func(t *testing.T, ns string, conn []string) {
		dir := t.TempDir()
		if err := os.Mkdir(filepath.Join(dir, "running"), 0o700); err != nil {
			t.Fatal(err)
		}
		// Each run marks itself running, records how many are, and leaves.
		script := `touch ` + dir + `/running/$$; ls ` + dir + `/running | wc -l >> ` + dir + `/counts; sleep 0.3; rm ` + dir + `/running/$$`
		var wg sync.WaitGroup
		codes := make([]int, 5)
		for i := range 5 {
			wg.Go(func() {
				out, err := cmd("run", "pool", conn, "--ttl", "10s", "--limit", "2", "--wait", "20s", "--", "sh", "-c", script).CombinedOutput()
				codes[i] = exitCode(err)
				if err != nil {
					t.Errorf("run %d: %v %s", i, err, out)
				}
			})
		}
		wg.Wait()
		raw, _ := os.ReadFile(filepath.Join(dir, "counts"))
		counts := strings.Fields(string(raw))
		if len(counts) != 5 {
			t.Fatalf("%d runs ran, want 5: %q", len(counts), counts)
		}
		for _, c := range counts {
			if n, _ := strconv.Atoi(c); n < 1 || n > 2 {
				t.Fatalf("%s ran at once, limit 2: %q", c, counts)
			}
		}
	})
}

func TestRunRenewsAndPassesTheTokenAndExitStatus(t *testing.T) {
	where(t, func(t *testing.T, ns string, conn []string) {
		dir := t.TempDir()
		// Wait until the token file holds a token other than the first one:
		// the lock (TTL 2s) was renewed while the command ran.
		script := `echo "$QUEEN_LOCK_NAME $QUEEN_LOCK_SLOT $QUEEN_LOCK_TOKEN" > ` + dir + `/env
while [ "$(cat "$QUEEN_LOCK_TOKEN_FILE")" = "$QUEEN_LOCK_TOKEN" ]; do sleep 0.05; done
while [ "$(cat "$QUEEN_LOCK_TOKEN_FILE")" -lt $((QUEEN_LOCK_TOKEN)) ]; do sleep 0.05; done
sleep 4.5
cat "$QUEEN_LOCK_TOKEN_FILE" > ` + dir + `/last
exit 7`
		c := cmd("run", "long", conn, "--ttl", "2s", "--", "sh", "-c", script)
		out, err := c.CombinedOutput()
		if code := exitCode(err); code != 7 {
			t.Fatalf("exit %d, want the command's 7: %s", code, out)
		}
		envLine, _ := os.ReadFile(filepath.Join(dir, "env"))
		f := strings.Fields(string(envLine))
		if len(f) != 3 || f[0] != "long" || f[1] != "0" {
			t.Fatalf("QUEEN_LOCK_* = %q", envLine)
		}
		last, _ := os.ReadFile(filepath.Join(dir, "last"))
		first, _ := strconv.ParseUint(f[2], 10, 64)
		lastTok, _ := strconv.ParseUint(strings.TrimSpace(string(last)), 10, 64)
		if lastTok <= first {
			t.Fatalf("token file %d, first token %d: not renewed", lastTok, first)
		}
	})
}

func TestRunStopsTheCommandWhenTheLockIsLost(t *testing.T) {
	where(t, func(t *testing.T, ns string, conn []string) {
		dir := t.TempDir()
		script := `trap 'echo term > ` + dir + `/term; exit 0' TERM; touch ` + dir + `/started; while true; do sleep 0.05; done`
		c := cmd("run", "doomed", conn, "--ttl", "3s", "--grace", "5s", "--", "sh", "-c", script)
		var stderr bytes.Buffer
		c.Stderr = &stderr
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the command to start", func() bool { return exists(filepath.Join(dir, "started")) })
		// Take the permit away by hand, as an operator would with kubectl.
		p := &locksv1alpha1.QueenLock{}
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: permit.Name("doomed", 0)}, p); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Delete(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		code := exitCode(c.Wait())
		if code != 75 || !exists(filepath.Join(dir, "term")) || !strings.Contains(stderr.String(), "lost the lock") {
			t.Fatalf("exit %d, SIGTERM seen %v, stderr %q", code, exists(filepath.Join(dir, "term")), stderr.String())
		}
	})
}

func TestHeldExitCodeAndScripts(t *testing.T) {
	where(t, func(t *testing.T, ns string, conn []string) {
		out, err := cmd("acquire", "batch", conn, "--ttl", "30s", "--owner", "me").Output()
		var r map[string]any
		if err != nil || json.Unmarshal(out, &r) != nil || r["acquired"] != true || r["owner"] != "me" {
			t.Fatalf("acquire: %v %s", err, out)
		}
		// Over the route no namespace is sent: the guard names the one
		// the route took.
		if g, _ := r["guard"].(map[string]any); g["namespace"] != ns {
			t.Fatalf("acquire's guard %v, want namespace %q", r["guard"], ns)
		}
		token := strconv.FormatFloat(r["token"].(float64), 'f', 0, 64)
		marker := filepath.Join(t.TempDir(), "ran")
		err = cmd("run", "batch", conn, "--ttl", "30s", "--held-exit-code", "9", "--", "touch", marker).Run()
		if exitCode(err) != 9 || exists(marker) {
			t.Fatalf("run against a held lock: exit %d, ran %v", exitCode(err), exists(marker))
		}
		out, err = cmd("acquire", "batch", conn, "--ttl", "30s", "--owner", "other").Output()
		if exitCode(err) != 3 || !strings.Contains(string(out), `"reason": "held"`) {
			t.Fatalf("acquire of a held lock: exit %d %s", exitCode(err), out)
		}
		out, err = cmd("renew", "batch", conn, "--token", token, "--owner", "me", "--ttl", "60s").Output()
		if err != nil || json.Unmarshal(out, &r) != nil || r["renewed"] != true {
			t.Fatalf("renew: %v %s", err, out)
		}
		token = strconv.FormatFloat(r["token"].(float64), 'f', 0, 64)
		out, err = cmd("get", "batch", conn).Output()
		if err != nil || !strings.Contains(string(out), `"owner": "me"`) {
			t.Fatalf("get: %v %s", err, out)
		}
		out, err = cmd("release", "batch", conn, "--token", token, "--owner", "me").Output()
		if err != nil || !strings.Contains(string(out), `"released": true`) {
			t.Fatalf("release: %v %s", err, out)
		}
		out, err = cmd("release", "batch", conn, "--token", token, "--owner", "me").Output()
		if exitCode(err) != 3 || !strings.Contains(string(out), `"reason": "lost"`) {
			t.Fatalf("second release: exit %d %s", exitCode(err), out)
		}
	})
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"run", "x", "--kubeconfig", kubeconfig, "--ttl", "30s"}, // no command
		{"run", "x", "--kubeconfig", kubeconfig, "--", "true"},   // no ttl
		{"run", "x#y", "--kubeconfig", kubeconfig, "--ttl", "1s", "--", "true"},
		{"acquire", "x", "--kubeconfig", kubeconfig, "--ttl", "1.5s"},
		{"acquire", "x", "--kubeconfig", kubeconfig, "--ttl", "30s", "--limit", "0"},
		{"acquire", "x", "--ttl", "30s"}, // nowhere to go
		{"frobnicate"},
	} {
		c := exec.Command(queenlock, args...)
		c.Env = append(os.Environ(), "QUEEN_LOCKS_URL=", "KUBERNETES_SERVICE_HOST=")
		out, err := c.CombinedOutput()
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if exitCode(err) != 2 || len(lines) != 2 || !strings.HasPrefix(lines[0], "queenlock "+args[0]+": ") || !strings.Contains(lines[1], "queenlock help") {
			t.Errorf("%q: exit %d, want the mistake and where to read usage:\n%s", args, exitCode(err), out)
		}
	}
}
