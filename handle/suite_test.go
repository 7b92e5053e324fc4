package handle_test

import (
	"os"
	"testing"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/route"
)

var env *controlplane.Env

func TestMain(m *testing.M) {
	os.Exit(controlplane.TestMain(m, controlplane.Options{}, func(e *controlplane.Env) { env = e }))
}

// startRoute serves an --auth=none route for namespace ns on a loopback port
// until stop is called or the test ends.
func startRoute(t *testing.T, ns string) (url string, stop func()) {
	t.Helper()
	return env.ServeRoute(t, route.AuthNone, ns)
}
