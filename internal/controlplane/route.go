package controlplane

import (
	"cmp"
	"context"
	"net"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"

	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/locks"
)

// ServeRoute serves the lock route with auth (and ns as the default
// namespace) on a free loopback port until the test ends or stop is called.
// It answers the route's full URL.
func (e *Env) ServeRoute(t T, auth, ns string) (url string, stop func()) {
	t.Helper()
	url, stop, err := e.StartRoute(e.Config, auth, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return url, stop
}

// StartRoute serves the lock route over cfg, which may point elsewhere than
// this control plane (an API server that is not there, say), on a free
// loopback port until stop is called. It answers the route's full URL.
func (e *Env) StartRoute(cfg *rest.Config, auth, ns string) (url string, stop func(), err error) {
	return e.StartRouteConfig(route.Config{Auth: auth, DefaultNamespace: ns, REST: cfg})
}

// StartRouteConfig serves a route configured by c on a free loopback port
// until stop is called; REST (the manager's identity), Scheme, Mapper, Log
// and OpTimeout are this control plane's when unset. It answers the route's full URL, https when
// c serves TLS.
func (e *Env) StartRouteConfig(c route.Config) (url string, stop func(), err error) {
	if c.REST == nil {
		c.REST = cmp.Or(e.managerConfig, e.Config)
	}
	if c.Scheme == nil {
		c.Scheme = manager.Scheme
	}
	if c.Mapper == nil {
		c.Mapper = e.Manager.GetRESTMapper()
	}
	if c.Log.GetSink() == nil {
		c.Log = logr.Discard()
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = 10 * time.Second
	}
	if c.Waker == nil && e.Waker != nil {
		c.Waker = e.Waker
	}
	if c.Locks == nil {
		// As the manager runs it: the same grace as its webhook, its
		// informer as a source of permit versions, and its renews and
		// takeovers stamped by the route itself.
		fence, err := manager.NewFence(c.REST, nil)
		if err != nil {
			return "", nil, err
		}
		c.Locks = []locks.Option{locks.WithGrace(e.Grace), locks.WithVersions(locks.CachedVersions(e.Manager.GetCache())), locks.AsManager(), locks.WithFence(fence)}
	}
	c.Addr = "127.0.0.1:0"
	srv, err := route.New(c)
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return "", nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx, ln); close(done) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	scheme := "http"
	if c.TLSCertDir != "" {
		scheme = "https"
	}
	return scheme + "://" + ln.Addr().String() + route.Path, stop, nil
}

// awaitManagerCreates waits, where the admission policy that keeps
// managedFields off the manager's creates is installed
// (config/default/manager_creates.yaml), until it acts on them: a server-side
// dry run of a stamped create of the manager's comes back without
// managedFields. kube-apiserver reads a new CRD's schema for policies every
// 5 s and answers the manager's stamped creates 503 until then, so that a
// manager started at once would send its first creates again unstamped, to
// the webhook, and a test counting webhook calls would count them. The
// probe runs before the manager, whose webhook then does not answer: only
// a create the policy acted on comes back. A policy that never acts fails
