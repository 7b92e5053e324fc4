// Command dev is make dev: a local control plane (etcd and kube-apiserver
// built by the project), the CRD and webhooks installed, and the manager
// serving the route on localhost:6632 with --auth=none. It writes
// .dev/kubeconfig and stops everything it started on Ctrl-C or SIGTERM,
// however many arrive and in whatever order.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/queen-locks/queen-locks/controllers"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/route"
)

func main() {
	addr := flag.String("route-address", envOr("QUEEN_LOCKS_DEV_ROUTE_ADDRESS", "127.0.0.1:6632"), "Address of the HTTP route; a loopback address, as the route runs with --auth=none (env QUEEN_LOCKS_DEV_ROUTE_ADDRESS).")
	ns := flag.String("namespace", "default", "Namespace of calls that name none.")
	dir := flag.String("dir", envOr("QUEEN_LOCKS_DEV_DIR", ".dev"), "Directory for the kubeconfig (env QUEEN_LOCKS_DEV_DIR).")
	pprofAddr := flag.String("pprof-address", "", "Serve Go's /debug/pprof of this process (the manager and its route) on this loopback address; empty serves none. make bench profiles the route with it.")
	flag.Parse()
	if err := servePprof(*pprofAddr); err != nil {
		fmt.Fprintln(os.Stderr, "make dev:", err)
		os.Exit(1)
	}
	// The signals are ours from the start, and stay ours: a SIGTERM to the
	// whole process group reaches this process twice (directly, and from
	// make passing it on), Ctrl-C may be pressed twice, and the parent's
	// death sends one more. Any of them stops everything once; none of them
	// may end the process before etcd and kube-apiserver are stopped, which
	// run in process groups of their own and would be left behind.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	stop := make(chan struct{})
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "make dev: %v: stopping\n", s)
		close(stop)
		for s := range sigs {
			fmt.Fprintf(os.Stderr, "make dev: %v: already stopping the manager, kube-apiserver and etcd\n", s)
		}
	}()
	stopWithParent()
	if err := run(stop, *addr, *ns, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "make dev:", err)
		os.Exit(1)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(stop <-chan struct{}, addr, ns, dir string) error {
	// A signal while this starts is kept in stop: the control plane is then
	// stopped as soon as it is up, never left running.
	env, err := controlplane.Start(controlplane.Options{
		Verbose: true,
		// The manager's default, not the tests' shorter one: make dev
		// behaves as an installed manager does.
		ExpiryGrace:      controllers.DefaultGrace,
		RouteAddr:        addr,
		Auth:             route.AuthNone,
		DefaultNamespace: ns,
		// As installed: the manager's own ServiceAccount and RBAC, never
		// the administrator kubectl uses here.
		ManagerConfig: controlplane.AsManagerServiceAccount,
		// Gated pods on, with their webhook, policies and pod rights: no
		// kubelet runs here, so a gated pod is let in but never started.
		GatedPods: true,
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
	// The roles the docs bind a namespace's users to, as the chart
	// installs them. Their aggregation into edit and view needs
	// kube-controller-manager, which does not run here: bind them by name.
	for _, f := range []string{"config/rbac/holder_role.yaml", "config/rbac/viewer_role.yaml"} {
		if err := env.ApplyFile(f); err != nil {
			return err
		}
	}
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
  roles:       queen-locks-holder, queen-locks-viewer (bind them in a namespace)
Ctrl-C stops it all.
`, env.Config.Host, kubeconfig, kubeconfig, addr, ns)
	select {
	case <-stop:
	case <-env.Done():
		return fmt.Errorf("the manager stopped: %v", env.Err()) //nolint:errorlint // Err is nil when the manager stopped cleanly: %w would print %!w(<nil>)
	}
	return nil
}

// servePprof serves the process's profiles on addr, a loopback address
// (they show every lock's name and owner in their labels and stacks, so
// nobody else may read them), until the process ends. Empty serves none.
func servePprof(addr string) error {
	if addr == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-pprof-address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return errors.New("-pprof-address must be a loopback address such as 127.0.0.1:6060, got " + addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("-pprof-address: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return nil
}
