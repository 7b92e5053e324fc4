package clients_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/queen-locks/queen-locks/internal/controlplane"
)

var (
	env *controlplane.Env
	// root is the module's root: the runners run there, as CI does.
	root string
	// queenlock is the CLI, built for this run; kubeconfig is the admin's,
	// for the tests that delete a permit or write a ConfigMap by hand with
	// kubectl.
	queenlock, kubeconfig, kubectl string
	// tmp holds queenlock and kubeconfig until the tests end.
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
		return fmt.Errorf("building queenlock: %v: %s", err, out)
	}
	kubeconfig = filepath.Join(tmp, "kubeconfig")
	return os.WriteFile(kubeconfig, e.Env.KubeConfig, 0o600)
}
