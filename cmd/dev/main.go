// Command dev is make dev: a local control plane (etcd and kube-apiserver
// built by the project), the CRD and webhooks installed, and the manager
// serving the route on localhost:6632 with --auth=none. It writes
// .dev/kubeconfig and stops everything it started on Ctrl-C or SIGTERM.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/route"
)

func main() {
	addr := flag.String("route-address", "127.0.0.1:6632", "Address of the HTTP route.")
	ns := flag.String("namespace", "default", "Namespace of calls that name none.")
	dir := flag.String("dir", ".dev", "Directory for the kubeconfig.")
	flag.Parse()
	ctx := ctrl.SetupSignalHandler()
	stopWithParent()
	if err := run(ctx.Done(), *addr, *ns, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "make dev:", err)
		os.Exit(1)
	}
}

func run(stop <-chan struct{}, addr, ns, dir string) error {
	env, err := controlplane.Start(controlplane.Options{
		Verbose:          true,
		RouteAddr:        addr,
		Auth:             route.AuthNone,
		DefaultNamespace: ns,
	})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(os.Stderr, "stopping the manager, kube-apiserver and etcd")
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping:", err)
		}
	}()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(kubeconfig, env.Env.KubeConfig, 0o600); err != nil {
		return err
	}
	fmt.Printf(`
queen-locks is running.
  API server:  %s
  kubeconfig:  %s    (kubectl --kubeconfig %s get queenlocks -A)
  route:       http://%s/api/v1/locks  (auth none, namespace %s)
Ctrl-C stops it all.
`, env.Config.Host, kubeconfig, kubeconfig, addr, ns)
	select {
	case <-stop:
	case <-env.Done():
		return fmt.Errorf("the manager stopped: %v", env.Err())
	}
	return nil
}
