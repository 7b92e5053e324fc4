package webhook_test

import (
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/queen-locks/queen-locks/internal/controlplane"
)

var env *controlplane.Env

// No expiry controller: the tests here take over expired permits by hand.
func TestMain(m *testing.M) {
	os.Exit(controlplane.TestMain(m, controlplane.Options{NoExpiry: true,
		// Deployments as well: TestGuardedKindsAreGuardedWhole guards them.
		GuardedResources: []schema.GroupVersionResource{{Version: "v1", Resource: "configmaps"}, {Version: "v1", Resource: "secrets"}, {Group: "apps", Version: "v1", Resource: "deployments"}}}, func(e *controlplane.Env) { env = e }))
}
