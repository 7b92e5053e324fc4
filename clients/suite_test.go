package clients_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/testcert"
)

var (
	env *controlplane.Env
	// root is the module's root: the runners run there, as CI does.
	root string
	// queenlock is the CLI, built for this run; kubeconfig is the admin's,
	// for the tests that delete a permit or write a ConfigMap by hand with
	// kubectl.
	queenlock, kubeconfig, kubectl string
	// tlsDir holds a CA and a serving certificate for a TLS proxy.
	tlsDir string
	// tmp holds all of these until the tests end.
	tmp string
)

func TestMain(m *testing.M) {
	code := controlplane.TestMain(m, controlplane.Options{}, func(e *controlplane.Env) {
		env = e
		root = controlplane.Root()
		kubectl = filepath.Join(root, "bin", "kubectl")
		if err := setUp(e); err != nil {
			fmt.Fprintln(os.Stderr, "setting up the clients' tests:", err)
			_ = e.Stop()
			_ = os.RemoveAll(tmp)
			os.Exit(1)
		}
	})
	if tmp != "" {
		_ = os.RemoveAll(tmp)
	}
	os.Exit(code)
}

func setUp(e *controlplane.Env) error {
	if _, err := os.Stat(kubectl); err != nil {
		return fmt.Errorf("bin/kubectl is missing (make tools builds it): %w", err)
	}
	var err error
	if tmp, err = os.MkdirTemp("", "queen-locks-clients-"); err != nil {
		return err
	}
	queenlock = filepath.Join(tmp, "queenlock")
	build := exec.Command("go", "build", "-o", queenlock, "./cmd/queenlock")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building queenlock: %w: %s", err, out)
	}
	kubeconfig = filepath.Join(tmp, "kubeconfig")
	if err := os.WriteFile(kubeconfig, e.Env.KubeConfig, 0o600); err != nil {
		return err
	}
	tlsDir = filepath.Join(tmp, "tls")
	return writeTLS(tlsDir)
}

// writeTLS writes a CA (ca.crt) and a serving certificate for 127.0.0.1
// signed by it (tls.crt, tls.key) into dir: the handles' tests put a TLS
// proxy in front of the route and verify it with ca.crt.
func writeTLS(dir string) error {
	ca, err := testcert.New()
	if err != nil {
		return err
	}
	if err := ca.WriteServing(dir, "127.0.0.1"); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "ca.crt"), ca.PEM, 0o600)
}
