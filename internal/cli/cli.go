// Package cli is the queenlock command: run a command under a lock, or
// acquire, renew, release, get and list locks from scripts, with JSON out.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/permit"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitError   = 1 // the server could not be reached, or it refused the call
	ExitUsage   = 2 // the command line is wrong
	ExitNotHeld = 3 // acquire: held or contended; renew, release: lost; check: not ok
	// ExitLost is run's status when the lock was lost while CMD ran and CMD
	// itself exited 0: the work may not have been done alone.
	ExitLost = 75
)

const usage = `queenlock: locks and semaphores with fencing tokens, from the shell.

Usage:
  queenlock run NAME --ttl 30s [--limit N] [--wait 10s] [--owner ID] [--held-exit-code N] [--grace 10s] -- CMD [ARG...]
  queenlock guard NAME [--label | --annotation] [--deletable] [-o lines|json]
                                      (inside run: the current token's guard)
  queenlock acquire NAME --ttl 30s [--limit N] [--owner ID]
  queenlock renew NAME --token T [--slot S] [--owner ID] [--ttl 30s]
  queenlock release NAME --token T [--slot S] [--owner ID]
  queenlock get NAME
  queenlock list [-o json|table] [--expiry-grace 1s]
                                      (over the Kubernetes API only)
  queenlock dashboard [--kubeconfig F] [-n NS | -A] [--port P] [--no-open]
                                      the Locks page on 127.0.0.1, as the kubeconfig's user

Where the locks are, in this order:
  --server URL, or QUEEN_LOCKS_URL   the route, e.g. https://queen-locks.queen-locks.svc:6632
    --token-file FILE, or QUEEN_LOCKS_TOKEN_FILE
                                     its bearer token, read again when it changes (default
                                     /var/run/secrets/queen-locks/token when it exists)
    --ca-file FILE, or QUEEN_LOCKS_CA_FILE
                                     PEM CAs that sign the route's certificate (https)
  --kubeconfig FILE, or in a pod     straight to the Kubernetes API
  -n, --namespace NS                 the namespace of the locks

Exit status: 0 done; 1 error; 2 bad usage; 3 not acquired, or lost.
run exits with CMD's status (128+N when CMD died of signal N); 0 without
running CMD when the lock is held elsewhere (or --held-exit-code); 75 when
the lock was lost while CMD ran and CMD exited 0; 128+N when signal N
(SIGTERM, SIGINT, SIGHUP) stopped it before CMD ran. Those signals are passed
on to CMD while it runs; the lock is released before queenlock exits.
`

// Env is what the command sees of its process: arguments, streams, environment.
type Env struct {
	Args   []string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
}

// Main runs the command and answers its exit status.
func Main(ctx context.Context, e Env) int {
	if len(e.Args) == 0 || e.Args[0] == "-h" || e.Args[0] == "--help" || e.Args[0] == "help" {
		fmt.Fprint(e.Stderr, usage)
		if len(e.Args) == 0 {
			return ExitUsage
		}
		return ExitOK
	}
	cmd, args := e.Args[0], e.Args[1:]
	var err error
	code := ExitOK
	switch cmd {
	case "run":
		code, err = runCmd(ctx, e, args)
	case "guard":
		code, err = guardCmd(e, args)
	case "acquire", "renew", "release", "get", "list":
		code, err = scriptCmd(ctx, e, cmd, args)
	case "dashboard":
		code, err = dashboardCmd(ctx, e, args)
	default:
		err = usageError("unknown command %q", cmd)
	}
	var ue *usageErr
	switch {
	case errors.As(err, &ue):
		// The mistake alone, not the whole usage after it, where it would
		// scroll out of sight.
		fmt.Fprintf(e.Stderr, "queenlock %s: %v\nRun queenlock help for the commands and their flags.\n", cmd, err)
		return ExitUsage
	case apierrors.IsUnauthorized(err):
		// The API server's own message is the one word.
		fmt.Fprintf(e.Stderr, "queenlock %s: %v: the Kubernetes API did not accept the credentials (the kubeconfig's user, or a token that expired)\n", cmd, err)
		return ExitError
	case err != nil:
		fmt.Fprintf(e.Stderr, "queenlock %s: %v\n", cmd, err)
		return ExitError
	}
	return code
}

type usageErr struct{ msg string }

func (u *usageErr) Error() string { return u.msg }

func usageError(format string, args ...any) error {
	return &usageErr{fmt.Sprintf(format, args...)}
}

// common are the flags every command takes.
type common struct {
	server, kubeconfig, namespace, tokenFile, caFile string
}

func (c *common) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.server, "server", "", "URL of the route (default $QUEEN_LOCKS_URL)")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig, to talk to the Kubernetes API directly")
	fs.StringVar(&c.namespace, "namespace", "", "namespace of the locks")
	fs.StringVar(&c.namespace, "n", "", "namespace of the locks (shorthand)")
	fs.StringVar(&c.tokenFile, "token-file", "", "bearer token for the route, read again when it changes (default $"+handle.TokenFileEnv+", else "+handle.ProjectedTokenFile+" when it exists)")
	fs.StringVar(&c.caFile, "ca-file", "", "PEM CAs that sign the route's certificate (default $"+caFileEnv+")")
}

// caFileEnv names the environment variable with the route's CA file.
const caFileEnv = "QUEEN_LOCKS_CA_FILE"

// parse reads flags around the one positional NAME, and answers NAME and
// whatever follows a "--".
func parse(fs *flag.FlagSet, args []string, wantName bool) (name string, rest []string, err error) {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		return "", nil, usageError("%v", err)
	}
	rest = fs.Args()
	if wantName {
		if len(rest) == 0 || rest[0] == "--" {
			return "", nil, usageError("a lock NAME is required")
		}
		name, rest = rest[0], rest[1:]
		if err := permit.ValidateName(name); err != nil {
			return "", nil, usageError("lock name %q: %v", name, err)
		}
		if err := fs.Parse(rest); err != nil {
			return "", nil, usageError("%v", err)
		}
		rest = fs.Args()
	}
	return name, rest, nil
}

// transport picks where the locks are: the route when a URL is given, else
// the Kubernetes API with a kubeconfig or from inside a pod. Either way a
// run that waits is woken when a slot frees: by the route's waitSeconds, or
// by a watch of the lock's permits.
func (c *common) transport(e Env) (handle.Transport, client.Client, error) {
	server := c.server
	if server == "" {
		server = e.Getenv("QUEEN_LOCKS_URL")
	}
	if server != "" {
		if !strings.Contains(strings.TrimPrefix(strings.TrimPrefix(server, "http://"), "https://"), "/") {
			server = strings.TrimSuffix(server, "/") + "/api/v1/locks"
		}
		tokenFile := c.tokenFile
		if tokenFile == "" {
			tokenFile = e.Getenv(handle.TokenFileEnv)
		}
		// With neither, the transport sends the projected token when the
		// pod has one mounted at the default path.
		caFile := c.caFile
		if caFile == "" {
			caFile = e.Getenv(caFileEnv)
		}
		return handle.HTTP(server, handle.HTTPOptions{Namespace: c.namespace, TokenFile: tokenFile, CAFile: caFile}), nil, nil
	}
	if c.caFile != "" || c.tokenFile != "" {
		return nil, nil, usageError("--ca-file and --token-file are for the route: give --server or QUEEN_LOCKS_URL too")
	}
	var cfg *rest.Config
	ns := c.namespace
	switch {
	case c.kubeconfig != "":
		loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: c.kubeconfig}, &clientcmd.ConfigOverrides{})
		var err error
		if cfg, err = loader.ClientConfig(); err != nil {
			return nil, nil, fmt.Errorf("reading %s: %w", c.kubeconfig, err)
		}
		if ns == "" {
			ns, _, _ = loader.Namespace()
		}
	case e.Getenv("KUBERNETES_SERVICE_HOST") != "":
		var err error
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, nil, err
		}
		if ns == "" {
			b, _ := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
			ns = strings.TrimSpace(string(b))
		}
	default:
		return nil, nil, usageError("no server: set --server or QUEEN_LOCKS_URL for the route, or --kubeconfig for the Kubernetes API")
	}
	if ns == "" {
		ns = "default"
	}
	scheme := runtime.NewScheme()
	if err := locksv1alpha1.AddToScheme(scheme); err != nil {
		return nil, nil, err
	}
	// The kinds the command uses, mapped up front: discovery would cost
	// round trips on every run, and its failure would stand in for the API
	// server's answer to the call itself ("failed to get server groups:
	// ..." for list, acquire and get alike).
	mapper := meta.NewDefaultRESTMapper([]schema.GroupVersion{locksv1alpha1.GroupVersion})
	mapper.Add(locksv1alpha1.GroupVersion.WithKind("QueenLock"), meta.RESTScopeNamespace)
	mapper.Add(locksv1alpha1.GroupVersion.WithKind("QueenLockWaiter"), meta.RESTScopeNamespace)
	// A client that can watch: a waiting run then watches the lock's
	// permits and is woken when one frees, instead of asking again and
	// again (handle.Kube waits only with a client.WithWatch).
	kc, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme, Mapper: mapper})
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to the Kubernetes API: %w", err)
	}
	return handle.Kube(kc, ns), kc, nil
}

func ttlSeconds(d time.Duration) (int64, error) {
	s := int64(d / time.Second)
	if d%time.Second != 0 || permit.ValidateTTL(s) != nil {
		return 0, usageError("--ttl %v: must be whole seconds from 1s to %ds", d, permit.MaxTTLSeconds)
	}
	return s, nil
}

func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// scriptCmd runs one operation and prints its result as the route would.
