// Package route serves the HTTP route POST /api/v1/locks: lock operations
// for pods in any language. It verifies each caller's token and rights with
// the API server, then acts with the manager's own identity.
package route

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/net/netutil"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/internal/sources"
	"github.com/queen-locks/queen-locks/locks"
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
	host, _ := os.Hostname()
	s.self = locks.New(c, cfg.Clock, append([]locks.Option{locks.WithDeletesOver(d), locks.CountsWaiting(), locks.WithCarrier("route/" + host)}, cfg.Locks...)...)
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
	ln = netutil.LimitListener(sources.LimitListener(ln, l.MaxConnectionsPerSource, func() { refused.WithLabelValues("too_many_connections_of_source").Inc() }), l.MaxConnections)
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
