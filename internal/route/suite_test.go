package route_test

import (
	"fmt"
	"os"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/route"
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

// serve starts a route over cfg until the process ends.
func serve(auth string, cfg *rest.Config) (string, error) {
	url, _, err := env.StartRoute(cfg, auth, "default")
	return url, err
}
