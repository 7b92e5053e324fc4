// Package route serves the HTTP route POST /api/v1/locks: lock operations
// for pods in any language, carried out on the API server as the caller.
package route

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/wire"
)

// Auth modes.
const (
	// AuthToken acts on the API server as the caller, with the bearer token
	// it sends: Kubernetes RBAC, quotas and audit apply as they are.
	AuthToken = "token"
	// AuthNone acts with the manager's own identity. For make dev only.
	AuthNone = "none"
)

// Path is the route's path; MaxBody the largest body it reads.
const (
	Path    = "/api/v1/locks"
	MaxBody = 1 << 20
)

// Config configures the route.
type Config struct {
	// Addr to listen on, ":6632" in a cluster.
	Addr string
	// Auth is AuthToken or AuthNone.
	Auth string
	// DefaultNamespace is the namespace of a call that names none, with AuthNone.
	DefaultNamespace string
	// REST reaches the API server. With AuthToken only its address and CA are
	// used; the caller's token replaces its credentials.
	REST   *rest.Config
	Scheme *runtime.Scheme
	Mapper meta.RESTMapper
	Clock  clock.PassiveClock
	Log    logr.Logger
	// OpTimeout bounds each operation's calls to the API server.
	OpTimeout time.Duration
}

// Server is the route. It is a manager Runnable that every replica runs.
type Server struct {
	cfg   Config
	self  *locks.Client     // AuthNone
	anon  *rest.Config      // AuthToken: address and CA, no credentials
	httpc http.RoundTripper // AuthToken: shared TLS transport to the API server
	ids   *identityCache    // AuthToken
	ready func(context.Context) error
}

// New builds the route.
func New(cfg Config) (*Server, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.OpTimeout == 0 {
		cfg.OpTimeout = 20 * time.Second
	}
	if cfg.Addr == "" {
		cfg.Addr = ":6632"
	}
	// No client-side rate limit: every call is a caller's own request, and
	// the API server's priority and fairness already shares it out. A shared
	// token bucket here would make one busy caller slow down everyone.
	cfg.REST = rest.CopyConfig(cfg.REST)
	cfg.REST.QPS, cfg.REST.Burst, cfg.REST.RateLimiter = -1, 0, nil
	s := &Server{cfg: cfg}
	switch cfg.Auth {
	case AuthNone:
		if cfg.DefaultNamespace == "" {
			return nil, fmt.Errorf("--auth=none needs a default namespace")
		}
		c, err := client.New(cfg.REST, client.Options{Scheme: cfg.Scheme, Mapper: cfg.Mapper})
		if err != nil {
			return nil, fmt.Errorf("creating the route's client: %w", err)
		}
		s.self = locks.New(c, cfg.Clock)
	case AuthToken:
		s.anon = rest.AnonymousClientConfig(cfg.REST)
		rt, err := rest.TransportFor(s.anon)
		if err != nil {
			return nil, fmt.Errorf("creating the route's transport: %w", err)
		}
		s.httpc = rt
		s.ids = newIdentityCache()
	default:
		return nil, fmt.Errorf("unknown auth mode %q: token or none", cfg.Auth)
	}
	return s, nil
}

// NeedLeaderElection is false: every replica serves the route.
func (s *Server) NeedLeaderElection() bool { return false }

// Start serves until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("route: listening on %s: %w", s.cfg.Addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on ln until ctx ends, then drains in-flight calls.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.cfg.Log.Info("serving the lock route", "addr", ln.Addr().String(), "auth", s.cfg.Auth)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

// Handler is the route's HTTP handler: the lock route and its probes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(Path, s.serveLocks)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	return mux
}

// callError is an answer other than 200 to a whole call.
type callError = wire.Error

func (s *Server) serveLocks(w http.ResponseWriter, r *http.Request) {
	start := s.cfg.Clock.Now()
	code := s.handle(w, r)
	requestDuration.WithLabelValues(fmt.Sprint(code)).Observe(s.cfg.Clock.Since(start).Seconds())
}

func (s *Server) handle(w http.ResponseWriter, r *http.Request) int {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return writeError(w, callError{Code: http.StatusMethodNotAllowed, Message: "use POST"})
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return writeError(w, callError{Code: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("the body is over %d bytes", MaxBody)})
		}
		return writeError(w, callError{Code: http.StatusBadRequest, Message: "reading the body: " + err.Error()})
	}
	req, bad := Decode(body)
	if bad != nil {
		e := callError{Code: http.StatusBadRequest, Message: bad.Error(), Field: bad.Field}
		if bad.Index >= 0 {
			e.Index = &bad.Index
		}
		return writeError(w, e)
	}
	lc, ns, cerr := s.authorize(r, req.Namespace)
	if cerr != nil {
		return writeError(w, *cerr)
	}
	results, cerr := s.run(r.Context(), lc, ns, req.Operations)
	if cerr != nil {
		s.cfg.Log.Error(errors.New(cerr.Message), "lock call failed", "namespace", ns, "code", cerr.Code)
		return writeError(w, *cerr)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(wire.Response{Results: results})
	return http.StatusOK
}

// authorize finds who the caller is and in which namespace the call acts,
// and the client to act with.
func (s *Server) authorize(r *http.Request, ns string) (*locks.Client, string, *callError) {
	if s.cfg.Auth == AuthNone {
		if ns == "" {
			ns = s.cfg.DefaultNamespace
		}
		return s.self, ns, nil
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	token = strings.TrimSpace(token)
	if !ok || token == "" {
		return nil, "", &callError{Code: http.StatusUnauthorized, Message: "no credentials: send Authorization: Bearer <ServiceAccount token>"}
	}
	hc := &http.Client{Transport: bearer{token: token, next: s.httpc}}
	id, err := s.ids.lookup(r.Context(), s.anon, hc, token)
	if err != nil {
		return nil, "", classify(-1, "", err)
	}
	if ns == "" {
		if id.namespace == "" {
			return nil, "", &callError{Code: http.StatusBadRequest, Field: "namespace",
				Message: fmt.Sprintf("namespace: is required, as %q is not a ServiceAccount", id.username)}
		}
		ns = id.namespace
	}
	c, err := client.New(s.anon, client.Options{HTTPClient: hc, Scheme: s.cfg.Scheme, Mapper: s.cfg.Mapper})
	if err != nil {
		return nil, "", &callError{Code: http.StatusInternalServerError, Message: "creating a client for the caller: " + err.Error()}
	}
	return locks.New(c, s.cfg.Clock), ns, nil
}

// run carries out the operations concurrently and answers them in order. An
// operation that the API server could not carry out fails the whole call:
// 401 or 403 as the API server said, else 503.
func (s *Server) run(ctx context.Context, lc *locks.Client, ns string, ops []Operation) ([]wire.Result, *callError) {
	results := make([]wire.Result, len(ops))
	errs := make([]error, len(ops))
	var wg sync.WaitGroup
	for i, op := range ops {
		wg.Go(func() {
			octx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
			defer cancel()
			start := s.cfg.Clock.Now()
			results[i], errs[i] = s.do(octx, lc, ns, i, op)
			outcome := results[i].Outcome()
			if errs[i] != nil {
				outcome = "error"
			}
			operations.WithLabelValues(op.Op, outcome).Inc()
			operationDuration.WithLabelValues(op.Op).Observe(s.cfg.Clock.Since(start).Seconds())
			s.cfg.Log.V(1).Info("lock operation", "namespace", ns, "op", op.Op, "name", op.Name, "slot", results[i].Slot, "outcome", outcome)
		})
	}
	wg.Wait()
	var worst *callError
	for i, err := range errs {
		if err == nil {
			continue
		}
		if e := classify(i, ops[i].Op, err); worst == nil || rank(e.Code) > rank(worst.Code) {
			worst = e
		}
	}
	return results, worst
}

func (s *Server) do(ctx context.Context, lc *locks.Client, ns string, i int, op Operation) (wire.Result, error) {
	res := wire.Result{Index: i, Op: op.Op, Name: op.Name}
	switch op.Op {
	case OpAcquire:
		owner := op.Owner
		if owner == "" {
			owner = locks.MintOwner("route-")
		}
		a, err := lc.Acquire(ctx, ns, op.Name, owner, op.TTLSeconds, op.Limit)
		if err != nil {
			return res, err
		}
		res.Acquired = &a.Acquired
		if a.Acquired {
			res.Already = a.Already
			res.Held(a.Permit, ns, op.Name, true)
		} else {
			res.Reason = a.Reason
			if a.Reason == locks.ReasonHeld {
				res.Holders = wire.Holders(a.Holders)
			}
		}
	case OpRenew:
		rn, err := lc.Renew(ctx, ns, op.Name, op.Slot, op.Token, op.Owner, op.TTLSeconds)
		if err != nil {
			return res, err
		}
		res.Renewed = &rn.Renewed
		if rn.Renewed {
			res.Held(rn.Permit, ns, op.Name, false)
		} else {
			res.Reason = rn.Reason
		}
	case OpRelease:
		ok, err := lc.Release(ctx, ns, op.Name, op.Slot, op.Token, op.Owner)
		if err != nil {
			return res, err
		}
		res.Released = &ok
		if !ok {
			res.Reason = locks.ReasonLost
		}
	case OpGet:
		hs, err := lc.Get(ctx, ns, op.Name)
		if err != nil {
			return res, err
		}
		res.Holders = wire.Holders(hs)
	case OpCheck:
		ok, err := lc.Check(ctx, ns, op.Name, op.Slot, op.Expect)
		if err != nil {
			return res, err
		}
		res.OK = &ok
		if !ok {
			res.Reason = locks.ReasonKVPrecondition
		}
	}
	return res, nil
}

// classify maps an error from the API server to the call's answer.
func classify(i int, op string, err error) *callError {
	e := &callError{Message: err.Error()}
	if i >= 0 {
		e.Index = &i
		e.Message = fmt.Sprintf("operations[%d] (%s): %v", i, op, err)
	}
	switch {
	case apierrors.IsUnauthorized(err):
		e.Code = http.StatusUnauthorized
	case apierrors.IsForbidden(err):
		e.Code = http.StatusForbidden
	case apierrors.IsNotFound(err):
		// Only a namespace can be missing here: a missing permit is an answer.
		e.Code, e.Field = http.StatusBadRequest, "namespace"
	default:
		e.Code = http.StatusServiceUnavailable
		e.Message += "; some operations may have applied: send the same call again with the same owners"
	}
	return e
}

// rank orders the answers of a failed call: the caller must fix its
// credentials before anything else is worth reporting.
func rank(code int) int {
	switch code {
	case http.StatusUnauthorized:
		return 3
	case http.StatusForbidden:
		return 2
	case http.StatusBadRequest:
		return 1
	}
	return 0
}

func writeError(w http.ResponseWriter, e callError) int {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Code)
	_ = json.NewEncoder(w).Encode(wire.ErrorResponse{Error: e})
	return e.Code
}

// bearer sends the caller's token with every request to the API server.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}
