package route_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/manager"
	"github.com/queen-locks/queen-locks/route"
)

var (
	env *controlplane.Env
	// devURL serves the route with --auth=none (namespace "default"),
	// tokenURL with --auth=token.
	devURL, tokenURL string
)

func TestMain(m *testing.M) {
	os.Exit(controlplane.TestMain(m, controlplane.Options{}, func(e *controlplane.Env) {
		env = e
		var err error
		if devURL, err = serve(route.AuthNone, e.Config); err == nil {
			tokenURL, err = serve(route.AuthToken, e.Config)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}))
}

// serveWith starts a --auth=none route over cfg.
func serveWith(cfg *rest.Config) (string, error) { return serve(route.AuthNone, cfg) }

// serve starts a route on a free loopback port until the process ends.
func serve(auth string, cfg *rest.Config) (string, error) {
	srv, err := route.New(route.Config{
		Auth: auth, DefaultNamespace: "default", REST: cfg, OpTimeout: 5 * time.Second,
		Scheme: manager.Scheme, Mapper: env.Manager.GetRESTMapper(), Log: logr.Discard(),
	})
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go func() { _ = srv.Serve(context.Background(), ln) }()
	return "http://" + ln.Addr().String() + route.Path, nil
}
