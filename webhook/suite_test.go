package webhook_test

import (
	"os"
	"testing"

	"github.com/queen-locks/queen-locks/internal/controlplane"
)

var env *controlplane.Env

// No expiry controller: the tests here take over expired permits by hand.
func TestMain(m *testing.M) {
	os.Exit(controlplane.TestMain(m, controlplane.Options{NoExpiry: true}, func(e *controlplane.Env) { env = e }))
}
