package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/permit"
)

// Inside queenlock run, queenlock guard prints the current token's guard:
// after a renew, the token of run's token file, read when it is called.
func TestGuardInsideRunPrintsTheCurrentToken(t *testing.T) {
	where(t, func(t *testing.T, ns string, conn []string) {
		dir := t.TempDir()
		script := `set -e
# Wait for a renew, so that the guard must come from the token file.
while [ "$(cat "$QUEEN_LOCK_TOKEN_FILE")" = "$QUEEN_LOCK_TOKEN" ]; do sleep 0.05; done
echo $QUEEN_LOCK_TOKEN > ` + dir + `/first
cat "$QUEEN_LOCK_TOKEN_FILE" > ` + dir + `/before
` + queenlock + ` guard report > ` + dir + `/lines
` + queenlock + ` guard report -o json > ` + dir + `/json
cat "$QUEEN_LOCK_TOKEN_FILE" > ` + dir + `/after
`
		c := cmd("run", "report", conn, "--ttl", "2s", "--", "sh", "-c", script)
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("run: %v: %s", err, out)
		}
		first, before, after := tokenOf(t, dir, "first"), tokenOf(t, dir, "before"), tokenOf(t, dir, "after")
		lines := strings.Split(read(t, filepath.Join(dir, "lines")), "\n")
		if len(lines) != 3 || lines[0] != "locks.queen.dev/guarded=true" || !strings.HasPrefix(lines[1], "locks.queen.dev/guard=report#0=") || lines[2] != "" {
			t.Fatalf("queenlock guard printed %q", lines)
		}
		g, err := permit.ParseGuard(strings.TrimPrefix(lines[1], "locks.queen.dev/guard="))
		if err != nil || g.Token <= first || g.Token < before || g.Token > after {
			t.Fatalf("printed token %d (%v): want the token file's, renewed past %d, between %d and %d", g.Token, err, first, before, after)
		}
		var j struct{ Labels, Annotations map[string]string }
		if err := json.Unmarshal([]byte(read(t, filepath.Join(dir, "json"))), &j); err != nil ||
			j.Labels[permit.GuardedLabel] != "true" || !strings.HasPrefix(j.Annotations[permit.GuardAnnotation], "report#0=") {
			t.Fatalf("queenlock guard -o json printed %+v (%v)", j, err)
		}
	})
}

// The shell way, as docs/fencing.md shows it: kubectl writes a guarded
// ConfigMap with the label and annotation queenlock guard prints, and the
// webhook admits it and binds the object to the lock.
func TestGuardInsideRunFencesAKubectlWrite(t *testing.T) {
	where(t, func(t *testing.T, ns string, conn []string) {
		kubectl := filepath.Join(controlplane.Root(), "bin", "kubectl") + " --kubeconfig " + kubeconfig + " -n " + ns
		// A lifetime long enough that no renew moves the token while
		// kubectl runs: a refusal would be the test's race, not a fault.
		script := `set -e
` + kubectl + ` create configmap out --from-literal=report=by-run --dry-run=client -o yaml |
  ` + kubectl + ` label --local -f - $(` + queenlock + ` guard report --label) -o yaml |
  ` + kubectl + ` annotate --local -f - $(` + queenlock + ` guard report --annotation) -o yaml |
  ` + kubectl + ` create -f -
`
		c := cmd("run", "report", conn, "--ttl", "2m", "--", "sh", "-c", script)
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("run: %v: %s", err, out)
		}
		cm := &corev1.ConfigMap{}
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "out"}, cm); err != nil {
			t.Fatal(err)
		}
		rec, bound, err := permit.ParseFence(cm.Annotations[permit.FenceAnnotation])
		if err != nil || !bound || cm.Labels[permit.GuardedLabel] != "true" || rec.Lock != "report" {
			t.Fatalf("stored labels %v annotations %v: not fenced by report", cm.Labels, cm.Annotations)
		}
	})
}

func tokenOf(t *testing.T, dir, name string) uint64 {
	t.Helper()
	tok, err := permit.Token(strings.TrimSpace(read(t, filepath.Join(dir, name))))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return tok
}

// Outside a run holding the lock there is no guard to print: queenlock
// guard exits 3 and says why, and prints nothing on stdout.
func TestGuardOutsideAHoldingExitsNonZero(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		says string
	}{
		{"no run", nil, "QUEEN_LOCK_NAME is not set"},
		{"another lock", []string{"QUEEN_LOCK_NAME=other", "QUEEN_LOCK_SLOT=0", "QUEEN_LOCK_TOKEN=12"}, `this queenlock run holds "other"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := exec.Command(queenlock, "guard", "report")
			c.Env = append(os.Environ(), "QUEEN_LOCK_NAME=", "QUEEN_LOCK_SLOT=", "QUEEN_LOCK_TOKEN=", "QUEEN_LOCK_TOKEN_FILE=")
			c.Env = append(c.Env, tc.env...)
			var stdout, stderr bytes.Buffer
			c.Stdout, c.Stderr = &stdout, &stderr
			err := c.Run()
			if code := exitCode(err); code != 3 || stdout.Len() != 0 || !strings.Contains(stderr.String(), tc.says) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want 3, nothing, and %q", code, stdout.String(), stderr.String(), tc.says)
			}
		})
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
