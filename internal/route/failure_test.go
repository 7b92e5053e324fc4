package route_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/rest"
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
	defer func() { _ = other.Stop() }()
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

// failingFor is a REST config whose requests with want in their query fail
// as if the API server did not answer: one operation of a call fails while
// the others go through.
func failingFor(want string) *rest.Config {
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			if strings.Contains(r.URL.RawQuery, want) {
				return nil, errors.New("connection reset by the test")
			}
			return rt.RoundTrip(r)
		})
	}
	return cfg
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A call answered 503 gives back what it acquired for an operation that
// named no owner (its caller cannot learn the minted owner, so could never
// release it), and keeps what it acquired for a named owner, whose caller
// converges by sending the call again.
func TestA503GivesBackWhatNoCallerCanRelease(t *testing.T) {
	ns := namespace(t)
	url, _, err := env.StartRoute(failingFor("blip"), route.AuthNone, ns)
	if err != nil {
		t.Fatal(err)
	}
	code, out := call(t, url, "", body(ns, acquire("ownerless", "", 600, 0), `{"op":"get","name":"blip"}`))
	if code != http.StatusServiceUnavailable {
		t.Fatalf("answered %d: %v, want 503", code, out)
	}
	if _, ok := permitOf(t, ns, "ownerless"); ok {
		t.Fatal("the ownerless acquire of a call answered 503 is still held")
	}
	code, out = call(t, url, "", body(ns, acquire("named", "cron-7", 600, 0), `{"op":"get","name":"blip"}`))
	if code != http.StatusServiceUnavailable {
		t.Fatalf("answered %d: %v, want 503", code, out)
	}
	if _, ok := permitOf(t, ns, "named"); !ok {
		t.Fatal("the named owner's acquire was given back; its retry could not converge")
	}
	if r := one(t, ns, acquire("named", "cron-7", 600, 0)); r["already"] != true {
		t.Fatalf("the named owner's retry: %v, want already", r)
	}
}

// A semaphore acquire whose create won and whose settling list then failed
// answers 503 and leaves nothing held.
func TestA503AfterASemaphoreCreateLeavesNothingHeld(t *testing.T) {
	ns := namespace(t)
	url, _, err := env.StartRoute(failingFor("labelSelector"), route.AuthNone, ns) // lists fail, creates go through
	if err != nil {
		t.Fatal(err)
	}
	code, out := call(t, url, "", body(ns, acquire("sem", "", 600, 3)))
	if code != http.StatusServiceUnavailable {
		t.Fatalf("answered %d: %v, want 503", code, out)
	}
	if ps := permits(t, ns); len(ps) != 0 {
		t.Fatalf("%d permits left held after a 503, owner %q", len(ps), ps[0].Spec.Owner)
	}
}
