// Package webhookserver is the manager's admission webhook server: the one
// controller-runtime builds, with bounds. controller-runtime's server has
// no read timeout, no bound on connections or on the bodies it holds, and
// reads a body of up to 7 MiB from anyone who reaches the port; a hundred
// such bodies put the manager over its memory limit, and with
// failurePolicy Fail every lock write in the cluster with it. This server
// keeps controller-runtime's registration (and its webhook metrics) and
// serves the same handlers behind the bounds of Limits, and can require
// the API server's client certificate, refusing everyone else at TLS.
package webhookserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/queen-locks/queen-locks/internal/sources"
	"golang.org/x/net/netutil"
	"golang.org/x/sync/semaphore"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
)

// Options configure the server.
type Options struct {
	Host string
	Port int
	// CertDir holds tls.crt and tls.key, re-read when they change.
	CertDir string
	// ClientCAFile, when set, is a PEM file of the CAs whose client
	// certificates the server accepts; every other connection is refused
	// during the TLS handshake. Give it the CA of the certificate the API
	// server presents to webhooks (its AdmissionConfiguration's
	// kubeConfigFile; docs/install.md).
	ClientCAFile string
	// Limits; DefaultLimits when zero.
	Limits Limits
	Log    logr.Logger
}

var refused = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "queen_locks_webhook_refused_total",
	Help: "Connections and reviews the webhook server refused before a webhook saw them, by reason (too_many_connections_of_source, body_too_large, body_memory, body_memory_of_source, body_read).",
}, []string{"reason"})

func init() { metrics.Registry.MustRegister(refused) }

// Server implements controller-runtime's webhook.Server.
type Server struct {
	// DefaultServer registers the handlers on its mux, instrumented with
	// controller-runtime's webhook metrics; it is never started.
	*ctrlwebhook.DefaultServer
	o       Options
	clients *x509.CertPool

	// large holds the bodies above SmallBody; perSource the same per
	// address; decoding lets largeDecodes of them be decoded at once.
	large     *semaphore.Weighted
	perSource sources.Tally
	decoding  *semaphore.Weighted

	mu      sync.Mutex
	started bool
}

// largeDecodes is how many large reviews are decoded at once: decoding
// takes a few times a body's size, and the API server's large reviews are
// rare.
const largeDecodes = 2

// New builds the server. A client CA that cannot be read stops it here.
func New(o Options) (*Server, error) {
	if o.Limits == (Limits{}) {
		o.Limits = DefaultLimits()
	}
	if err := o.Limits.Check(); err != nil {
		return nil, err
	}
	if o.Port == 0 {
		o.Port = ctrlwebhook.DefaultPort
	}
	if o.CertDir == "" {
		o.CertDir = filepath.Join(os.TempDir(), "k8s-webhook-server", "serving-certs")
	}
	if o.Log.GetSink() == nil {
		o.Log = logr.Discard()
	}
	s := &Server{
		DefaultServer: ctrlwebhook.NewServer(ctrlwebhook.Options{Host: o.Host, Port: o.Port, CertDir: o.CertDir}).(*ctrlwebhook.DefaultServer),
		o:             o,
		large:         semaphore.NewWeighted(o.Limits.MaxBodyMemory),
		decoding:      semaphore.NewWeighted(largeDecodes),
	}
	if o.ClientCAFile != "" {
		pem, err := os.ReadFile(o.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("--webhook-client-ca-file: %w", err)
		}
		s.clients = x509.NewCertPool()
		if !s.clients.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--webhook-client-ca-file %s holds no PEM certificate", o.ClientCAFile)
		}
	}
	return s, nil
}

// Start serves until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	addr := net.JoinHostPort(s.o.Host, strconv.Itoa(s.o.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("webhook server: listening on %s: %w", addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves TLS on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	certs, err := certwatcher.New(filepath.Join(s.o.CertDir, "tls.crt"), filepath.Join(s.o.CertDir, "tls.key"))
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("webhook server: %w", err)
	}
	go func() {
		if err := certs.Start(ctx); err != nil {
			s.o.Log.Error(err, "watching the webhook server's certificate")
		}
	}()
	cfg := &tls.Config{
		GetCertificate: certs.GetCertificate,
		MinVersion:     tls.VersionTLS12,
		// HTTP/1.1 only: one review at a time per connection, so that
		// MaxConnections bounds the reviews in progress (HTTP/2 would
		// allow hundreds of streams on each).
		NextProtos: []string{"http/1.1"},
	}
	if s.clients != nil {
		cfg.ClientCAs = s.clients
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	l := s.o.Limits
	ln = netutil.LimitListener(sources.LimitListener(ln, l.MaxConnectionsPerSource, func() { refused.WithLabelValues("too_many_connections_of_source").Inc() }), l.MaxConnections)
	srv := &http.Server{
		BaseContext:       func(net.Listener) context.Context { return ctx },
		Handler:           s.bound(s.WebhookMux()),
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
		// No HTTP/2 upgrade: see NextProtos.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
		// Failed handshakes (no client certificate) and cut connections
		// are the callers' doing; under a flood the log would be the flood.
		ErrorLog: log.New(logWriter{s.o.Log.V(1)}, "", 0),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(tls.NewListener(ln, cfg)) }()
	s.mu.Lock()
	s.started = true
	s.mu.Unlock()
	s.o.Log.Info("serving webhooks", "addr", ln.Addr().String(), "clientCertificates", s.clients != nil)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

// StartedChecker is healthy once the server listens.
func (s *Server) StartedChecker() healthz.Checker {
	return func(*http.Request) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if !s.started {
			return errors.New("webhook server has not been started yet")
		}
		return nil
	}
}

// bound reads each review's body within the limits before next sees it.
func (s *Server) bound(next http.Handler) http.Handler {
	l := s.o.Limits
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > l.MaxBody {
			s.refuse(w, r, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("the review is over %d bytes", l.MaxBody))
			return
		}
		size := r.ContentLength
		if size < 0 {
			size = l.MaxBody
		}
		if size > SmallBody {
			release, reason := s.hold(r, size)
			if reason != "" {
				w.Header().Set("Retry-After", "1")
				s.refuse(w, r, http.StatusTooManyRequests, reason, "the webhook server holds as many large reviews as it may; try again")
				return
			}
			defer release()
		}
		body, err := readBody(w, r, l.MaxBody)
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				s.refuse(w, r, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("the review is over %d bytes", l.MaxBody))
				return
			}
			s.refuse(w, r, http.StatusBadRequest, "body_read", "reading the review failed or took too long")
			return
		}
		if size > SmallBody {
			if err := s.decoding.Acquire(r.Context(), 1); err != nil {
				return
			}
			defer s.decoding.Release(1)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// hold reserves size bytes for a large body, from the whole budget and from
// its source's share; a caller with a verified client certificate (the API
// server, when it presents one) draws from the whole budget only.
func (s *Server) hold(r *http.Request, size int64) (release func(), reason string) {
	verified := r.TLS != nil && len(r.TLS.VerifiedChains) > 0
	var leave func()
	if !verified {
		var ok bool
		if leave, ok = s.perSource.Take(sources.Of(r.RemoteAddr), size, s.o.Limits.MaxBodyMemoryPerSource); !ok {
			return nil, "body_memory_of_source"
		}
	}
	if !s.large.TryAcquire(size) {
		if leave != nil {
			leave()
		}
		return nil, "body_memory"
	}
	return sync.OnceFunc(func() {
		s.large.Release(size)
		if leave != nil {
			leave()
		}
	}), ""
}

// readBody reads the whole body into a buffer of its Content-Length, or up
// to max when it sends none.
func readBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	if r.ContentLength >= 0 {
		b := make([]byte, r.ContentLength)
		_, err := io.ReadFull(r.Body, b)
		return b, err
	}
	return io.ReadAll(http.MaxBytesReader(w, r.Body, max))
}

func (s *Server) refuse(w http.ResponseWriter, r *http.Request, code int, reason, msg string) {
	refused.WithLabelValues(reason).Inc()
	s.o.Log.V(1).Info("refused a review", "remote", r.RemoteAddr, "reason", reason)
	// The body may be unread: the connection cannot carry another review.
	w.Header().Set("Connection", "close")
	http.Error(w, msg, code)
}

type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Info("webhook connection", "error", strings.TrimSpace(string(p)))
	return len(p), nil
}
