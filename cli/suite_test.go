package cli_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/manager"
	"github.com/queen-locks/queen-locks/route"
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
			if out, err = exec.Command("go", "build", "-o", queenlock, "../cmd/queenlock").CombinedOutput(); err != nil {
				err = fmt.Errorf("%v: %s", err, out)
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

// startRoute serves an --auth=none route for ns until the test ends.
func startRoute(t *testing.T, ns string) string {
	t.Helper()
	srv, err := route.New(route.Config{Auth: route.AuthNone, DefaultNamespace: ns, REST: env.Config,
		Scheme: manager.Scheme, Mapper: env.Manager.GetRESTMapper(), Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + ln.Addr().String()
}
