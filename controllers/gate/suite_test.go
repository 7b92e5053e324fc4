package gate_test

import (
	"os"
	"testing"

	"github.com/queen-locks/queen-locks/internal/controlplane"
)

var env *controlplane.Env

// The suite runs the manager with gated pods on, under its own
// ServiceAccount, with the webhook configuration, the admission policies
// and the pod rights of config/gate installed: as the chart installs them.
func TestMain(m *testing.M) {
	os.Exit(controlplane.TestMain(m, controlplane.Options{GatedPods: true}, func(e *controlplane.Env) { env = e }))
}
