package cli_test

import (
	"bytes"
	"context"
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

// Inside queenlock run, queenlock guard prints the current token's guard,
// and kubectl writes a guarded ConfigMap with it; the webhook admits it and
// records that token. Renews change the token; guard reads it from run's
// token file when it is called.
func TestGuardInsideRunFencesAKubectlWrite(t *testing.T) {
	where(t, func(t *testing.T, ns string, conn []string) {
		dir := t.TempDir()
		kubectl := filepath.Join(controlplane.Root(), "bin", "kubectl") + " --kubeconfig " + kubeconfig + " -n " + ns
		script := `set -e
ql=` + queenlock + `
# Wait for a renew, so that the guard must come from the token file.
while [ "$(cat "$QUEEN_LOCK_TOKEN_FILE")" = "$QUEEN_LOCK_TOKEN" ]; do sleep 0.05; done
$ql guard report > ` + dir + `/lines
$ql guard report -o json > ` + dir + `/json
cat "$QUEEN_LOCK_TOKEN_FILE" > ` + dir + `/token
` + kubectl + ` create configmap out --from-literal=report=by-run --dry-run=client -o yaml |
  ` + kubectl + ` label --local -f - $($ql guard report --label) -o yaml |
  ` + kubectl + ` annotate --local -f - $($ql guard report --annotation) -o yaml |
  ` + kubectl + ` create -f -
`
		c := cmd("run", "report", conn, "--ttl", "2s", "--", "sh", "-c", script)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("run: %v: %s", err, out)
		}
		token := strings.TrimSpace(read(t, filepath.Join(dir, "token")))
		want := "locks.queen.dev/guarded=true\nlocks.queen.dev/guard=report#0=" + token + "\n"
		if got := read(t, filepath.Join(dir, "lines")); got != want {
			t.Fatalf("queenlock guard printed %q, want %q", got, want)
		}
		wantJSON := `{"annotations":{"locks.queen.dev/guard":"report#0=` + token + `"},"labels":{"locks.queen.dev/guarded":"true"}}` + "\n"
		if got := read(t, filepath.Join(dir, "json")); got != wantJSON {
			t.Fatalf("queenlock guard -o json printed %q, want %q", got, wantJSON)
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
