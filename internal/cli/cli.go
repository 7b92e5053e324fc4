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
	"text/tabwriter"
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
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/routeapi"
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
  queenlock acquire NAME --ttl 30s [--limit N] [--owner ID]
  queenlock renew NAME --token T [--slot S] [--owner ID] [--ttl 30s]
  queenlock release NAME --token T [--slot S] [--owner ID]
  queenlock get NAME
  queenlock list [-o json|table] [--expiry-grace 1s]
                                      (over the Kubernetes API only)

Where the locks are, in this order:
  --server URL, or QUEEN_LOCKS_URL   the route, e.g. https://queen-locks.queen-locks.svc:6632
    --token-file FILE, or QUEEN_LOCKS_TOKEN_FILE
                                     its bearer token, re-read at every call (default
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
	case "acquire", "renew", "release", "get", "list":
		code, err = scriptCmd(ctx, e, cmd, args)
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
	fs.StringVar(&c.tokenFile, "token-file", "", "bearer token for the route, re-read at every call (default $"+handle.TokenFileEnv+", else "+handle.ProjectedTokenFile+" when it exists)")
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
	// The one kind the command uses, mapped up front: discovery would cost
	// round trips on every run, and its failure would stand in for the API
	// server's answer to the call itself ("failed to get server groups:
	// ..." for list, acquire and get alike).
	mapper := meta.NewDefaultRESTMapper([]schema.GroupVersion{locksv1alpha1.GroupVersion})
	mapper.Add(locksv1alpha1.GroupVersion.WithKind("QueenLock"), meta.RESTScopeNamespace)
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
func scriptCmd(ctx context.Context, e Env, op string, args []string) (int, error) {
	fs := flag.NewFlagSet(op, flag.ContinueOnError)
	var c common
	c.bind(fs)
	ttl := fs.Duration("ttl", 0, "lifetime (acquire, renew)")
	limit := fs.Int("limit", 1, "semaphore limit (acquire)")
	owner := fs.String("owner", "", "owner (default: minted on acquire)")
	slot := fs.Int("slot", 0, "slot (renew, release)")
	token := fs.Uint64("token", 0, "token (renew, release)")
	var lo listOptions
	fs.StringVar(&lo.output, "output", "json", "json or table (list)")
	fs.StringVar(&lo.output, "o", "json", "json or table (list, shorthand)")
	fs.DurationVar(&lo.grace, "expiry-grace", DefaultExpiryGrace, "the manager's --expiry-grace: a permit this long past its expireTime is marked expired (list)")
	name, rest, err := parse(fs, args, op != "list")
	if err != nil {
		return 0, err
	}
	if len(rest) > 0 {
		return 0, usageError("unexpected arguments %q", rest)
	}
	if op == "list" && lo.output != "json" && lo.output != "table" {
		return 0, usageError("--output %q: json or table", lo.output)
	}
	if lo.grace < 0 {
		return 0, usageError("--expiry-grace %v: must not be negative", lo.grace)
	}
	t, kc, err := c.transport(e)
	if err != nil {
		return 0, err
	}
	res := routeapi.Result{Op: op, Name: name}
	code := ExitOK
	switch op {
	case "acquire":
		s, err := ttlSeconds(*ttl)
		if err != nil {
			return 0, err
		}
		if permit.ValidateLimit(int64(*limit)) != nil {
			return 0, usageError("--limit %d: must be from 1 to %d", *limit, permit.MaxLimit)
		}
		if *owner == "" {
			*owner = handle.MintOwner()
		}
		a, err := t.Acquire(ctx, name, *owner, s, *limit)
		if err != nil {
			return 0, err
		}
		res.Acquired = &a.Acquired
		if a.Acquired {
			res.Already = a.Already
			res.Held(a.Permit, t.Namespace(), name, true)
		} else {
			res.Reason, code = a.Reason, ExitNotHeld
			if a.Reason == locks.ReasonHeld {
				res.Holders = routeapi.Holders(a.Holders)
			}
		}
	case "renew":
		var s int64
		if *ttl != 0 {
			if s, err = ttlSeconds(*ttl); err != nil {
				return 0, err
			}
		}
		if *token == 0 {
			return 0, usageError("--token is required")
		}
		r, err := t.Renew(ctx, name, *slot, *token, *owner, s)
		if err != nil {
			return 0, err
		}
		res.Renewed = &r.Renewed
		if r.Renewed {
			res.Held(r.Permit, t.Namespace(), name, false)
		} else {
			res.Reason, code = r.Reason, ExitNotHeld
		}
	case "release":
		if *token == 0 {
			return 0, usageError("--token is required")
		}
		ok, err := t.Release(ctx, name, *slot, *token, *owner)
		if err != nil {
			return 0, err
		}
		res.Released = &ok
		if !ok {
			res.Reason, code = locks.ReasonLost, ExitNotHeld
		}
	case "get":
		hs, err := t.Get(ctx, name)
		if err != nil {
			return 0, err
		}
		res.Holders = routeapi.Holders(hs)
	case "list":
		if kc == nil {
			return 0, usageError("list reads every lock of a namespace, which the route does not offer: use --kubeconfig")
		}
		return list(ctx, e, kc, t.Namespace(), lo)
	}
	printJSON(e.Stdout, res)
	return code, nil
}

// DefaultExpiryGrace is the manager's --expiry-grace unless it is set
// otherwise: the controller deletes a permit this long after its expireTime.
const DefaultExpiryGrace = time.Second

// listOptions are list's flags.
type listOptions struct {
	output string        // json or table
	grace  time.Duration // the manager's expiry grace
}

// listed is one permit as list prints it: its holder as the route answers
// holders, the holder's pod, and whether it is overdue.
type listed struct {
	routeapi.Holder
	// Pod is the holder's pod, namespace/name, when the permit names one.
	Pod string `json:"pod,omitempty"`
	// Expired marks a permit past its expireTime plus the expiry grace that
	// is still there: the controller should have deleted it (is there a
	// leader? can it delete?). Nobody holds it; the next acquire takes it
	// over.
	Expired bool `json:"expired,omitempty"`
}

// list prints every permit of the namespace, lock by lock: the ones held,
// and the ones past their expireTime and the grace that the controller has
// not deleted, marked expired. A permit expired for less than the grace is
// left out: the controller is about to delete it, and nobody can take it
// over before then. A permit being deleted is left out: it was released.
func list(ctx context.Context, e Env, kc client.Client, ns string, o listOptions) (int, error) {
	var all locksv1alpha1.QueenLockList
	if err := kc.List(ctx, &all, client.InNamespace(ns)); err != nil {
		return 0, fmt.Errorf("listing the permits of namespace %q: %w", ns, err)
	}
	now := time.Now()
	type lockOut struct {
		Name    string   `json:"name"`
		Holders []listed `json:"holders"`
	}
	byName := map[string]*lockOut{}
	var out []*lockOut
	for i := range all.Items {
		p := &all.Items[i]
		if !p.DeletionTimestamp.IsZero() || p.Spec.ExpireTime == nil {
			continue
		}
		overdue := permit.Expired(p, now.Add(-o.grace)) // as the controller judges it
		if permit.Expired(p, now) && !overdue {
			continue
		}
		tok, err := permit.Token(p.ResourceVersion)
		if err != nil {
			return 0, err
		}
		l := byName[p.Spec.Lock]
		if l == nil {
			l = &lockOut{Name: p.Spec.Lock, Holders: []listed{}}
			byName[p.Spec.Lock] = l
			out = append(out, l)
		}
		h := listed{Holder: (*routeapi.Holders([]locks.Holder{{
			Slot: int(p.Spec.Slot), Owner: p.Spec.Owner, Token: tok,
			Since: p.Spec.AcquireTime.Time, RenewedAt: p.Spec.RenewTime.Time, ExpiresAt: p.Spec.ExpireTime.Time,
		}}))[0], Expired: overdue}
		if hp := p.Spec.HolderPod; hp != nil {
			podNS := hp.Namespace
			if podNS == "" {
				podNS = p.Namespace // a permit written before holderPod had a namespace
			}
			h.Pod = podNS + "/" + hp.Name
		}
		l.Holders = append(l.Holders, h)
	}
	if o.output == "table" {
		tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "LOCK\tSLOT\tOWNER\tTOKEN\tPOD\tEXPIRES\tEXPIRED")
		for _, l := range out {
			for _, h := range l.Holders {
				pod, expired := h.Pod, ""
				if pod == "" {
					pod = "-"
				}
				if h.Expired {
					expired = "EXPIRED"
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\t%s\n", l.Name, h.Slot, h.Owner, h.Token, pod, h.ExpiresAt, expired)
			}
		}
		return ExitOK, tw.Flush()
	}
	printJSON(e.Stdout, map[string]any{"namespace": ns, "locks": out})
	return ExitOK, nil
}
