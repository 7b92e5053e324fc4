package handle_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"

	"github.com/go-logr/logr"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/manager"
	"github.com/queen-locks/queen-locks/route"
)

var env *controlplane.Env

func TestMain(m *testing.M) {
	os.Exit(controlplane.TestMain(m, controlplane.Options{}, func(e *controlplane.Env) { env = e }))
}

// startRoute serves an --auth=none route for namespace ns on a loopback port
// until stop is called.
func startRoute(t *testing.T, ns string) (url string, stop func()) {
	t.Helper()
	srv, err := route.New(route.Config{Auth: route.AuthNone, DefaultNamespace: ns, REST: env.Config,
		Scheme: manager.Scheme, Mapper: env.Manager.GetRESTMapper(), Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx, ln); close(done) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return fmt.Sprintf("http://%s%s", ln.Addr(), route.Path), stop
}
