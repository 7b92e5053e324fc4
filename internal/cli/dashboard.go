package cli

import (
	"context"
	"flag"
	"fmt"
	"html"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/queen-locks/queen-locks/internal/dashboard"
)

// dashboardCmd serves the Locks page with the caller's own kubeconfig
// identity until it is interrupted.
func dashboardCmd(ctx context.Context, e Env, args []string) (int, error) {
	fs := flag.NewFlagSet("dashboard", flag.ContinueOnError)
	var kubeconfig, kubecontext, namespace string
	var all, noOpen bool
	var port int
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig (default $KUBECONFIG, else ~/.kube/config)")
	fs.StringVar(&kubecontext, "context", "", "the kubeconfig context to use (default its current one)")
	fs.StringVar(&namespace, "namespace", "", "the namespace shown (default the context's, else default)")
	fs.StringVar(&namespace, "n", "", "the namespace shown (shorthand)")
	fs.BoolVar(&all, "all-namespaces", false, "show every namespace the caller may list")
	fs.BoolVar(&all, "A", false, "show every namespace (shorthand)")
	fs.IntVar(&port, "port", 0, "the port on 127.0.0.1 (default a free one)")
	fs.BoolVar(&noOpen, "no-open", false, "print the URL only; do not open a browser")
	if _, rest, err := parse(fs, args, false); err != nil {
		return 0, err
	} else if len(rest) > 0 {
		return 0, usageError("dashboard takes no arguments, got %q", rest)
	}
	if all && namespace != "" {
		return 0, usageError("give -n NAMESPACE or -A, not both")
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubecontext})
	cfg, err := loader.ClientConfig()
	if err != nil {
		return 0, fmt.Errorf("reading the kubeconfig: %w", err)
	}
	if namespace == "" && !all {
		namespace, _, _ = loader.Namespace()
		if namespace == "" {
			namespace = "default"
		}
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	srv, err := dashboard.Start(ctx, cfg, dashboard.Options{Namespace: namespace, AllNamespaces: all, Port: port})
	if err != nil {
		return 0, err
	}
	// The URL alone on the first line, for scripts; it carries the secret,
	// so it goes to the caller's terminal and nowhere else.
	fmt.Fprintln(e.Stdout, srv.URL)
	scope := "namespace " + namespace
	if all {
		scope = "all namespaces"
	}
	fmt.Fprintf(e.Stderr, "queenlock dashboard: the Locks page of %s, as the kubeconfig's user, until Ctrl-C. Anyone with the URL can use it as you.\n", scope)
	if !noOpen {
		cleanup, err := openBrowser(srv.URL)
		defer cleanup()
		if err != nil {
			fmt.Fprintf(e.Stderr, "queenlock dashboard: could not open a browser (%v): open the URL above\n", err)
		}
	}
	if err := srv.Wait(); err != nil {
		return 0, err
	}
	return ExitOK, nil
}

// openBrowser opens url without putting it on a command line, where any
// local user could read the secret in the process list: the browser is
// given a file, readable by the caller alone, that sends it on (as
// Jupyter does). The file stays until the command ends, since a browser
// may read it late.
func openBrowser(url string) (cleanup func(), err error) {
	// os.MkdirTemp makes the directory 0700: the file is the caller's alone.
	dir, err := os.MkdirTemp("", "queenlock-dashboard-")
	if err != nil {
		return func() {}, err
	}
	cleanup = func() { _ = os.RemoveAll(dir) }
	page := filepath.Join(dir, "open.html")
	u := html.EscapeString(url)
	body := `<!doctype html><meta charset="utf-8"><meta name="referrer" content="no-referrer">` +
		`<meta http-equiv="refresh" content="0;url=` + u + `"><title>Locks</title><p><a href="` + u + `">Open the Locks page</a></p>`
	if err := os.WriteFile(page, []byte(body), 0o600); err != nil {
		return cleanup, err
	}
	var cmd *exec.Cmd
	switch runtime.GOOS {
	case "darwin":
		cmd = exec.Command("open", page)
	case "windows":
		cmd = exec.Command("rundll32", "url.dll,FileProtocolHandler", page)
	default:
		cmd = exec.Command("xdg-open", page)
	}
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		return cleanup, err
	}
	go func() { _ = cmd.Wait() }()
	return cleanup, nil
}
