package webhook_test

import (
	"os"
	"testing"
	"time"

	"github.com/queen-locks/queen-locks/internal/controlplane"
)

var env *controlplane.Env

// A long expiry grace keeps the controller out of the way, so the tests here
// can take over expired permits by hand.
func TestMain(m *testing.M) {
	os.Exit(controlplane.TestMain(m, controlplane.Options{ExpiryGrace: time.Hour}, func(e *controlplane.Env) { env = e }))
}
