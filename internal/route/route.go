// Package route serves the HTTP route POST /api/v1/locks: lock operations
// for pods in any language. It verifies each caller's token and rights with
// the API server, then acts with the manager's own identity.
package route

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/netutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/routeapi"
)

// The route writes permits with the manager's identity, for callers it has
// authorized.
// +kubebuilder:rbac:groups=locks.queen.dev,resources=queenlocks,verbs=get;list;watch;create;update;patch;delete

// Auth modes.
const (
	// AuthToken verifies each caller's ServiceAccount token with a
	// TokenReview and its rights with SubjectAccessReviews.
	AuthToken = "token"
	// AuthNone serves every caller, unverified, on a loopback address only.
	// For make dev only.
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
	// Audiences a caller's token must be issued for (one of them), with
	// AuthToken; [Audience] when empty. Naming the API server's own audience
	// would let callers send the token that also grants all their rights on
	// the API server: only do so knowingly.
	Audiences []string
	// ReviewTTL is how long TokenReview and SubjectAccessReview answers are
	// cached: above 0 and at most MaxReviewTTL; DefaultReviewTTL when 0.
	ReviewTTL time.Duration
	// TLSCertDir holds tls.crt and tls.key to serve TLS with, re-read when
	// they change; empty serves plain HTTP.
	TLSCertDir string
	// Limits bound slow and large calls; DefaultLimits when zero.
	Limits Limits
	// REST reaches the API server with the manager's identity.
	REST   *rest.Config
	Scheme *runtime.Scheme
	Mapper meta.RESTMapper
	Clock  clock.PassiveClock
	Log    logr.Logger
	// OpTimeout bounds each operation's calls to the API server.
	OpTimeout time.Duration
	// Locks adjusts how operations are carried out: the skew grace, and the
	// informer that spares a release its read.
	Locks []locks.Option
	// Waker wakes acquires that wait (waitSeconds); nil answers every
	// acquire at once.
	Waker locks.Waker
}

// Server is the route. It is a manager Runnable that every replica runs.
type Server struct {
	cfg     Config
	self    *locks.Client // the manager's identity
	reviews *reviews      // AuthToken
	adm     *admission
	certs   *certwatcher.CertWatcher // when serving TLS
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
	if cfg.ReviewTTL == 0 {
		cfg.ReviewTTL = DefaultReviewTTL
	}
	if cfg.Limits == (Limits{}) {
		cfg.Limits = DefaultLimits()
	}
	if err := cfg.Limits.check(cfg.OpTimeout); err != nil {
		return nil, err
	}
	if cfg.Auth == AuthNone {
		// Every caller is on loopback, one address: the per-address
		// bounds would be the route's whole.
		cfg.Limits.MaxConnectionsPerSource, cfg.Limits.MaxCallsPerSource = cfg.Limits.MaxConnections, cfg.Limits.MaxCalls
	}
	// No client-side rate limit: the concurrency limits above bound what
	// callers can ask, and the API server's priority and fairness shares
	// it out. A token bucket here would make one busy caller slow everyone.
	cfg.REST = rest.CopyConfig(cfg.REST)
	cfg.REST.QPS, cfg.REST.Burst, cfg.REST.RateLimiter = -1, 0, nil
	s := &Server{cfg: cfg, adm: newAdmission(cfg.Limits)}
	switch cfg.Auth {
	case AuthNone:
		if cfg.DefaultNamespace == "" {
			return nil, fmt.Errorf("--auth=none needs a default namespace (--default-namespace)")
		}
		if err := loopbackOnly(cfg.Addr); err != nil {
			return nil, err
		}
	case AuthToken:
		cs, err := kubernetes.NewForConfig(cfg.REST)
		if err != nil {
			return nil, fmt.Errorf("creating the route's review client: %w", err)
		}
		if s.reviews, err = newReviews(cs, cfg.Audiences, cfg.ReviewTTL, cfg.OpTimeout); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("--auth is %q: it must be token or none", cfg.Auth)
	}
	c, err := client.New(cfg.REST, client.Options{Scheme: cfg.Scheme, Mapper: cfg.Mapper})
	if err != nil {
		return nil, fmt.Errorf("creating the route's client: %w", err)
	}
	d, err := dynamic.NewForConfig(cfg.REST)
	if err != nil {
		return nil, fmt.Errorf("creating the route's client: %w", err)
	}
	s.self = locks.New(c, cfg.Clock, append([]locks.Option{locks.WithDeletesOver(d)}, cfg.Locks...)...)
	if cfg.TLSCertDir != "" {
		// Read now, so a missing or bad certificate stops the manager at
		// start rather than failing every caller's handshake.
		s.certs, err = certwatcher.New(filepath.Join(cfg.TLSCertDir, "tls.crt"), filepath.Join(cfg.TLSCertDir, "tls.key"))
		if err != nil {
			return nil, fmt.Errorf("--route-tls-cert-dir: %w", err)
		}
	}
	return s, nil
}

// loopbackOnly refuses, for AuthNone, an address that others can reach: it
// would let anyone who reaches it take or release any lock.
func loopbackOnly(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--route-address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("--auth=none serves every caller with the manager's identity, so --route-address must be a loopback address such as 127.0.0.1:6632; got %q", addr)
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
	if s.cfg.Auth == AuthNone {
		if err := loopbackOnly(ln.Addr().String()); err != nil {
			_ = ln.Close()
			return err
		}
	}
	l := s.cfg.Limits
	ln = netutil.LimitListener(limitPerSource(ln, l.MaxConnectionsPerSource), l.MaxConnections)
	scheme := "http"
	if s.certs != nil {
		go func() {
			if err := s.certs.Start(ctx); err != nil {
				s.cfg.Log.Error(err, "watching the route's certificate")
			}
		}()
		ln = tls.NewListener(ln, &tls.Config{GetCertificate: s.certs.GetCertificate, MinVersion: tls.VersionTLS12})
		scheme = "https"
	}
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
		// Failed handshakes and broken connections are the callers' doing;
		// under a flood of them the log would be the flood.
		ErrorLog: log.New(logWriter{s.cfg.Log.V(1)}, "", 0),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.cfg.Log.Info("serving the lock route", "addr", ln.Addr().String(), "scheme", scheme, "auth", s.cfg.Auth)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Info("route connection", "error", strings.TrimSpace(string(p)))
	return len(p), nil
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
type callError = routeapi.Error

func (s *Server) serveLocks(w http.ResponseWriter, r *http.Request) {
	start := s.cfg.Clock.Now()
	code, caller := s.handle(w, r)
	obs := requestDuration.WithLabelValues(fmt.Sprint(code))
	secs := s.cfg.Clock.Since(start).Seconds()
	if eo, ok := obs.(prometheus.ExemplarObserver); ok && caller.Username != "" {
		eo.ObserveWithExemplar(secs, exemplar(caller.Username))
	} else {
		obs.Observe(secs)
	}
}

// handle answers one call. Every refusal comes before any operation runs:
// credentials before the body is read, the body before any right is asked,
// every right before any operation.
func (s *Server) handle(w http.ResponseWriter, r *http.Request) (int, Caller) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return writeError(w, callError{Code: http.StatusMethodNotAllowed, Message: "use POST"}), Caller{}
	}
	leave, ok := s.adm.enter()
	if !ok {
		return s.busy(w, r, Caller{}, "too_many_calls", fmt.Sprintf("the route has %d calls in progress", s.cfg.Limits.MaxCalls)), Caller{}
	}
	defer leave()
	src := sourceOf(r.RemoteAddr)
	leaveSource, ok := s.adm.enterSource(src)
	if !ok {
		return s.busy(w, r, Caller{}, "too_many_calls_of_source", fmt.Sprintf("%s has %d calls in progress", src, s.cfg.Limits.MaxCallsPerSource)), Caller{}
	}
	defer leaveSource()

	var caller Caller
	if s.reviews != nil {
		var f *authFailure
		if caller, f = s.reviews.authenticate(r); f != nil {
			return s.refuse(w, r, caller, "", f), caller
		}
		leaveCaller, ok := s.adm.enterCaller(caller.Username)
		if !ok {
			return s.busy(w, r, caller, "too_many_calls_of_caller", fmt.Sprintf("%s has %d calls in progress", caller.Username, s.cfg.Limits.MaxCallsPerCaller)), caller
		}
		defer leaveCaller()
	}

	req, cerr := s.readCall(w, r, caller)
	if cerr != nil {
		return writeError(w, *cerr), caller
	}
	ns := req.Namespace
	if ns == "" {
		ns = caller.Namespace
	}
	if ns == "" && s.cfg.Auth == AuthNone {
		ns = s.cfg.DefaultNamespace
	}
	if ns == "" {
		return writeError(w, callError{Code: http.StatusBadRequest, Field: "namespace",
			Message: fmt.Sprintf("namespace: is required, as %q is not a ServiceAccount", caller.Username)}), caller
	}
	if s.reviews != nil {
		f := s.reviews.authorize(r.Context(), caller, ns, req.Operations)
		if f == nil || f.code == http.StatusForbidden {
			s.adm.proven.set(caller.Username, f == nil)
		}
		if f != nil {
			return s.refuse(w, r, caller, ns, f), caller
		}
	}
	results, cerr := s.run(r.Context(), caller, ns, req.Operations)
	if cerr != nil {
		return writeError(w, *cerr), caller
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(routeapi.Response{Results: results})
	s.cfg.Log.V(1).Info("lock call", "caller", caller.Username, "namespace", ns, "operations", len(results))
	return http.StatusOK, caller
}

// readCall reads and decodes the body, holding memory for it from the
// route's budget only while it does.
func (s *Server) readCall(w http.ResponseWriter, r *http.Request, caller Caller) (*Request, *callError) {
	tooBig := &callError{Code: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("the body is over %d bytes", MaxBody)}
	if r.ContentLength > MaxBody {
		return nil, tooBig
	}
	size := r.ContentLength
	if size < 0 {
		size = MaxBody
	}
	release, ok := s.adm.holdBody(caller.Username, s.reviews != nil, size)
	if !ok {
		refused.WithLabelValues("body_memory").Inc()
		s.cfg.Log.Info("refused a call: the route holds as many bodies as it may", "caller", caller.Username, "remote", r.RemoteAddr)
		w.Header().Set("Retry-After", fmt.Sprint(RetryAfter))
		return nil, &callError{Code: http.StatusTooManyRequests, Message: "the route is reading as many bodies as it may; nothing was applied, try again"}
	}
	defer release()
	var body []byte
	var err error
	if r.ContentLength >= 0 {
		// The server stops the body at its Content-Length: read it into a
		// buffer of exactly that size, never more.
		body = make([]byte, r.ContentLength)
		_, err = io.ReadFull(r.Body, body)
	} else {
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooBig
		}
		return nil, &callError{Code: http.StatusBadRequest, Message: "reading the body failed or took too long"}
	}
	if len(body) >= LargeBody {
		if err := s.adm.decoding.Acquire(r.Context(), 1); err != nil {
			return nil, &callError{Code: http.StatusServiceUnavailable, Message: "the call ended before its body was decoded"}
		}
		defer s.adm.decoding.Release(1)
	}
	req, bad := Decode(body)
	if bad != nil {
		e := callError{Code: http.StatusBadRequest, Message: bad.Error(), Field: bad.Field}
		if bad.Index >= 0 {
			e.Index = &bad.Index
		}
		return nil, &e
	}
	return req, nil
}

// refuse answers a call that failed authentication or authorization.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, caller Caller, ns string, f *authFailure) int {
	refused.WithLabelValues(f.reason).Inc()
	kv := []any{"caller", caller.Username, "namespace", ns, "remote", r.RemoteAddr, "reason", f.reason}
	if f.detail != nil {
		kv = append(kv, "error", f.detail.Error())
	}
	if f.code == http.StatusServiceUnavailable {
		s.cfg.Log.Error(f.detail, "could not review a call", kv...)
	} else {
		s.cfg.Log.Info("refused a call", kv...)
	}
	switch f.code {
	case http.StatusUnauthorized:
		v := `Bearer realm="queen-locks"`
		if f.reason == "invalid_token" {
			v += `, error="invalid_token"`
		}
		w.Header().Set("WWW-Authenticate", v)
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", fmt.Sprint(RetryAfter))
	}
	e := callError{Code: f.code, Message: f.message}
	if f.index >= 0 {
		e.Index = &f.index
	}
	return writeError(w, e)
}

// busy answers 429: the call was not admitted and nothing of it applied.
func (s *Server) busy(w http.ResponseWriter, r *http.Request, caller Caller, reason, why string) int {
	refused.WithLabelValues(reason).Inc()
	s.cfg.Log.Info("refused a call: too many in progress", "caller", caller.Username, "remote", r.RemoteAddr, "reason", reason)
	w.Header().Set("Retry-After", fmt.Sprint(RetryAfter))
	return writeError(w, callError{Code: http.StatusTooManyRequests, Message: why + "; nothing was applied, try again"})
}

// run carries out the operations of an authorized caller concurrently and
// answers them in order. An operation that the API server could not carry
// out fails the whole call: 400 for a namespace that does not exist, else
// 503.
func (s *Server) run(ctx context.Context, caller Caller, ns string, ops []Operation) ([]routeapi.Result, *callError) {
	results := make([]routeapi.Result, len(ops))
	errs := make([]error, len(ops))
	var wg sync.WaitGroup
	for i, op := range ops {
		one := func() {
			// A waiting acquire has its wait on top of the usual bound.
			// Each operation runs to a definite answer even if the caller
			// goes away, so that what it acquired can be given back; only a
			// waiting acquire stops waiting when the caller goes (waiting
			// is what it would otherwise keep doing for nobody).
			bound := s.cfg.OpTimeout + time.Duration(op.WaitSeconds)*time.Second
			octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
			defer cancel()
			gone, cancelGone := context.WithTimeout(ctx, bound)
			defer cancelGone()
			start := s.cfg.Clock.Now()
			results[i], errs[i] = s.do(octx, gone, caller, ns, i, op)
			outcome := results[i].Outcome()
			if errs[i] != nil {
				outcome = "error"
			}
			operations.WithLabelValues(op.Op, outcome).Inc()
			operationDuration.WithLabelValues(op.Op).Observe(s.cfg.Clock.Since(start).Seconds())
			if errs[i] != nil {
				s.cfg.Log.Error(errs[i], "lock operation failed", "caller", caller.Username, "namespace", ns, "op", op.Op, "name", op.Name)
			}
			s.cfg.Log.V(1).Info("lock operation", "caller", caller.Username, "namespace", ns, "op", op.Op, "name", op.Name, "slot", results[i].Slot, "outcome", outcome)
		}
		// Most calls carry one operation: it runs on the request's own
		// goroutine, whose stack has already grown to what an API call
		// needs, rather than on a new one that grows it again each time
		// (a tenth of a millisecond of copying stacks per call in the
		// profiles of make bench).
		if len(ops) == 1 {
			one()
		} else {
			wg.Go(one)
		}
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
	switch {
	case ctx.Err() != nil:
		s.giveBack(ctx, caller, ns, ops, results, func(Operation) bool { return true })
	case worst != nil:
		// The call answers an error, not its results: an acquire it won
		// for an operation that named no owner can never be renewed or
		// released by its caller, who cannot learn the minted owner. A
		// caller that named its owner converges by sending the call again.
		s.giveBack(ctx, caller, ns, ops, results, func(op Operation) bool { return op.Owner == "" })
	}
	return results, worst
}

// giveBack releases what the operations of a call that were chosen
// acquired, when nobody will receive those tokens (the caller went away
// while a waiting acquire kept the other operations' answers, or the call
// answers an error), so that nobody would release them before their TTLs
// end.
func (s *Server) giveBack(ctx context.Context, caller Caller, ns string, ops []Operation, results []routeapi.Result, chosen func(Operation) bool) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.OpTimeout)
	defer cancel()
	for i, r := range results {
		if ops[i].Op != OpAcquire || !chosen(ops[i]) || r.Acquired == nil || !*r.Acquired || r.Already || r.Token == nil || r.Slot == nil {
			continue
		}
		if _, err := s.self.Release(rctx, ns, ops[i].Name, *r.Slot, *r.Token, r.Owner); err != nil {
			s.cfg.Log.Error(err, "releasing what a call acquired after its caller went away", "caller", caller.Username, "namespace", ns, "name", ops[i].Name)
		}
	}
}

// do carries out one operation with the manager's identity. A permit the
// caller acquires records the caller's pod, when its token is bound to one,
// so that the permit is freed as soon as that pod is gone. ctx does not end
// when the caller goes away; gone does, and only a waiting acquire uses it.
func (s *Server) do(ctx, gone context.Context, caller Caller, ns string, i int, op Operation) (routeapi.Result, error) {
	lc := s.self
	res := routeapi.Result{Index: i, Op: op.Op, Name: op.Name}
	switch op.Op {
	case OpAcquire:
		owner := op.Owner
		if owner == "" {
			owner = locks.MintOwner("route-")
		}
		opts := []locks.AcquireOption{locks.HolderPod(caller.Namespace, caller.PodName, caller.PodUID)}
		actx := ctx
		if op.WaitSeconds > 0 && s.cfg.Waker != nil {
			// locks runs each try to its end itself and gives back what a
			// try won after the caller left.
			opts = append(opts, locks.WaitUpTo(time.Duration(op.WaitSeconds)*time.Second, s.cfg.Waker))
			actx = gone
		}
		a, err := lc.Acquire(actx, ns, op.Name, owner, op.TTLSeconds, op.Limit, opts...)
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
				res.Holders = routeapi.Holders(a.Holders)
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
		res.Holders = routeapi.Holders(hs)
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

// classify maps an error from the API server to the call's answer. The
// error itself goes to the log: its text can name the API server's address
// and the webhook's, which are none of the caller's business.
func classify(i int, op string, err error) *callError {
	if apierrors.IsNotFound(err) {
		// Only a namespace can be missing here: a missing permit is an answer.
		return &callError{Code: http.StatusBadRequest, Field: "namespace", Index: &i,
			Message: fmt.Sprintf("operations[%d] (%s): the namespace does not exist", i, op)}
	}
	if strings.Contains(err.Error(), "denied the request") {
		// A refusal that is neither held nor lost: a fault of queen-locks
		// (the route sent what the webhook will not admit), not an outage.
		return &callError{Code: http.StatusInternalServerError, Index: &i,
			Message: fmt.Sprintf("operations[%d] (%s): the admission webhook refused the route's write; see the manager's log", i, op)}
	}
	why := "the API server did not carry it out"
	if strings.Contains(err.Error(), "webhook") {
		why = "the admission webhook did not answer"
	} else if reason := apierrors.ReasonForError(err); reason != metav1.StatusReasonUnknown {
		why += " (" + string(reason) + ")"
	}
	return &callError{Code: http.StatusServiceUnavailable, Index: &i,
		Message: fmt.Sprintf("operations[%d] (%s): %s; some operations may have applied: send the same call again with the same owners", i, op, why)}
}

// rank orders the answers of a failed call: a namespace that does not exist
// is the caller's to fix, and worth saying over an outage.
func rank(code int) int {
	if code == http.StatusBadRequest {
		return 1
	}
	return 0
}

func writeError(w http.ResponseWriter, e callError) int {
	// A refused call does not keep its connection: a caller that only
	// sends what is refused (no token, a bad one, the wrong method) must
	// connect again for each try, and cannot sit on connections.
	w.Header().Set("Connection", "close")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Code)
	_ = json.NewEncoder(w).Encode(routeapi.ErrorResponse{Error: e})
	return e.Code
}
