// Package dashboard is the Locks page behind `queenlock dashboard`: a small
// web server on the loopback interface that shows, live, every permit the
// caller may list, the gated pods waiting behind each lock and the guarded
// objects bound to it, and lets the caller release a stuck permit by hand.
//
// Everything it reads and writes goes to the Kubernetes API with the
// caller's own kubeconfig identity, never the manager's: RBAC decides what
// the page shows and what a release may do, exactly as it would for
// kubectl. The server adds no rights of its own; what it adds is a guard
// against everyone else on the machine (other users, other web pages):
// a secret in every URL, a Host check against DNS rebinding, a same-origin
// check on writes, and no caching.
package dashboard

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
)

// Options choose what the page shows and where it is served.
type Options struct {
	// Namespace is the one namespace shown; ignored with AllNamespaces.
	Namespace string
	// AllNamespaces shows every namespace (kubectl's -A): the caller then
	// needs the right to list cluster-wide.
	AllNamespaces bool
	// Port is the loopback port; 0 picks a free one.
	Port int
	// Secret is the URL's secret; empty makes a random one. Tests set it.
	Secret string
}

// Server is a running Locks page.
type Server struct {
	// URL is the page's address, secret included: whoever has it may use
	// the page with the caller's identity, so it is shown only to them.
	URL string

	opts    Options
	secret  string
	port    int
	hub     *hub
	clients clients
	ln      net.Listener
	srv     *http.Server
	done    chan struct{}
	err     error
}

// clients are the caller's: every request the page makes to Kubernetes
// goes through them.
type clients struct {
	dyn  dynamic.Interface
	meta metadata.Interface
	kube kubernetes.Interface
}

// Start serves the page until ctx ends; Wait returns then. cfg is the
// caller's own client configuration.
func Start(ctx context.Context, cfg *rest.Config, o Options) (*Server, error) {
	cfg = rest.CopyConfig(cfg)
	// The page's watches are long-lived and its reads few: the client's
	// default rate limit of 5 a second would only delay a relist after a
	// broken watch.
	cfg.QPS, cfg.Burst = 50, 100
	var c clients
	var err error
	if c.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		return nil, fmt.Errorf("making a Kubernetes client: %w", err)
	}
	if c.meta, err = metadata.NewForConfig(cfg); err != nil {
		return nil, fmt.Errorf("making a Kubernetes client: %w", err)
	}
	if c.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, fmt.Errorf("making a Kubernetes client: %w", err)
	}
	secret := o.Secret
	if secret == "" {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		secret = base64.RawURLEncoding.EncodeToString(b)
	}
	if o.Port < 0 || o.Port > 65535 {
		return nil, fmt.Errorf("--port %d: must be from 0 (any free port) to 65535", o.Port)
	}
	// Only the IPv4 loopback address: never every interface, whatever the
	// machine's resolver says localhost is.
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(o.Port)))
	if err != nil {
		return nil, fmt.Errorf("listening on 127.0.0.1:%d: %w", o.Port, err)
	}
	s := &Server{
		opts: o, secret: secret, port: ln.Addr().(*net.TCPAddr).Port,
		clients: c, ln: ln, done: make(chan struct{}),
	}
	s.URL = fmt.Sprintf("http://127.0.0.1:%d/%s/", s.port, secret)
	ns := o.Namespace
	if o.AllNamespaces {
		ns = ""
	}
	s.hub = newHub(ns)
	s.srv = &http.Server{
		Handler:           s.handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		// No WriteTimeout: the event stream is one long response. Each
		// write to it is bounded by the stream itself (a stuck reader is
		// dropped when its queue fills).
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
		BaseContext:    func(net.Listener) context.Context { return ctx },
	}
	for _, src := range s.sources(ns) {
		go src.run(ctx, s.hub)
	}
	go s.watchAccess(ctx)
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.err = err
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s.hub.close()
		_ = s.srv.Shutdown(sctx)
		close(s.done)
	}()
	return s, nil
}

// Wait returns once the server has stopped, with the error that stopped
// it, if any.
func (s *Server) Wait() error {
	<-s.done
	return s.err
}

// Scope says what the page shows: a namespace, or "" for all.
func (s *Server) Scope() string { return s.hub.scope }
