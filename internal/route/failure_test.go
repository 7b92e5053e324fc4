package route_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/route"
)

// With the webhooks down (failurePolicy Fail), lock writes fail rather than
// pass unchecked, and the route says 503.
func TestWebhookNotAnsweringIs503(t *testing.T) {
	other, err := controlplane.Start(controlplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Stop()
	url, _ := other.ServeRoute(t, route.AuthNone, "default")
	if code, out := call(t, url, "", body("default", acquire("up", "o", 30, 0))); code != http.StatusOK {
		t.Fatalf("with the webhook up: %d %v", code, out)
	}
	other.StopManager()
	code, out := call(t, url, "", body("default", acquire("down", "o", 30, 0)))
	msg, _ := errorOf(t, out)["message"].(string)
	if code != http.StatusServiceUnavailable || !strings.Contains(msg, "webhook") {
		t.Fatalf("with the webhook down: %d %v", code, out)
	}
	// Reads need no webhook and still answer.
	if code, out := call(t, url, "", body("default", `{"op":"get","name":"up"}`)); code != http.StatusOK {
		t.Fatalf("get with the webhook down: %d %v", code, out)
	}
}

func TestOperationsAreCounted(t *testing.T) {
	before := testutil.ToFloat64(counter(t, "acquire", "acquired"))
	ns := namespace(t)
	one(t, ns, acquire("counted", "o", 30, 0))
	one(t, ns, acquire("counted", "p", 30, 0))
	if got := testutil.ToFloat64(counter(t, "acquire", "acquired")) - before; got != 1 {
		t.Fatalf("acquired counted %v times, want 1", got)
	}
	if n, err := testutil.GatherAndCount(metrics.Registry, "queen_locks_route_operation_duration_seconds"); err != nil || n == 0 {
		t.Fatalf("no latency histogram: %d %v", n, err)
	}
}

func counter(t *testing.T, op, outcome string) prometheus.Counter {
	t.Helper()
	return route.OperationsCounter(op, outcome)
}
