package cli_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/route"
)

var (
	env        *controlplane.Env
	queenlock  string // the built binary
	kubeconfig string
)

func TestMain(m *testing.M) {
	os.Exit(controlplane.TestMain(m, controlplane.Options{}, func(e *controlplane.Env) {
		env = e
		dir, err := os.MkdirTemp("", "queenlock-test-")
		if err == nil {
			queenlock = filepath.Join(dir, "queenlock")
			var out []byte
			if out, err = exec.Command("go", "build", "-o", queenlock, "../../cmd/queenlock").CombinedOutput(); err != nil {
				err = fmt.Errorf("%w: %s", err, out)
			}
			kubeconfig = filepath.Join(dir, "kubeconfig")
			if err == nil {
				err = os.WriteFile(kubeconfig, e.Env.KubeConfig, 0o600)
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "building queenlock:", err)
			os.Exit(1)
		}
	}))
}

// startRoute serves an --auth=none route for ns until the test ends and
// answers its base URL, as queenlock --server takes it.
func startRoute(t *testing.T, ns string) string {
	t.Helper()
	url, _ := env.ServeRoute(t, route.AuthNone, ns)
	return strings.TrimSuffix(url, route.Path)
}
