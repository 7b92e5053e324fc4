package route_test

import (
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/queen-locks/queen-locks/internal/metricstest"
	"github.com/queen-locks/queen-locks/internal/route"
)

// sample is one series of a metric of the manager's registry: a counter's
// value, or a histogram's count and sum, and the callers its exemplars
// name.
type sample struct {
	value, count, sum float64
	callers           []string
	found             bool
}

// metric reads the series of name whose labels are exactly labels.
func metric(t *testing.T, name string, labels map[string]string) sample {
	t.Helper()
	m := metricstest.Series(t, name, labels)
	if m == nil {
		return sample{}
	}
	if h := m.GetHistogram(); h != nil {
		s := sample{count: float64(h.GetSampleCount()), sum: h.GetSampleSum(), found: true}
		for _, b := range h.GetBucket() {
			for _, l := range b.GetExemplar().GetLabel() {
				if l.GetName() == "caller" {
					s.callers = append(s.callers, l.GetValue())
				}
			}
		}
		return s
	}
	return sample{value: m.GetCounter().GetValue(), found: true}
}

func waited(t *testing.T, ns, outcome string, waited bool) sample {
	t.Helper()
	return metric(t, "queen_locks_route_acquire_wait_seconds", map[string]string{"namespace": ns, "outcome": outcome, "waited": fmt.Sprint(waited)})
}

// Each acquire is timed from the start of its call to the answer, by how
// it ended and whether it asked to wait: a wait that runs out is a held
// that waited, and lasts the whole wait.
func TestAcquireWaitsAreTimedByOutcome(t *testing.T) {
	ns := namespace(t)
	held := one(t, ns, acquire("timed", "a", 60, 0))
	if held["acquired"] != true {
		t.Fatal(held)
	}
	if r := one(t, ns, acquire("timed", "b", 60, 0)); r["reason"] != "held" {
		t.Fatal(r)
	}
	start := time.Now()
	if r := one(t, ns, acquireWaiting("timed", "b", 60, 0, 1)); r["reason"] != "held" {
		t.Fatal(r)
	}
	ranOut := time.Since(start)
	for _, c := range []struct {
		outcome string
		waited  bool
	}{{"acquired", false}, {"held", false}, {"held", true}} {
		if got := waited(t, ns, c.outcome, c.waited); got.count != 1 {
			t.Errorf("%s, waited %v: %v acquires timed, want 1", c.outcome, c.waited, got.count)
		}
	}
	if got := waited(t, ns, "held", true).sum; got < 1 || got > ranOut.Seconds() {
		t.Errorf("a wait of 1 s that ran out was timed %v s (the call took %v)", got, ranOut)
	}
	if got := waited(t, ns, "held", false).sum; got >= 1 {
		t.Errorf("an acquire that did not wait was timed %v s", got)
	}

	// A waiter that gets the lock: timed from its call (which came in
	// before it was seen waiting) to its answer (after the release).
	before, sleeping := env.Waker.Waiting(), env.Waker.Asleep()
	start = time.Now()
	won := inBackground(t, ns, acquireWaiting("timed", "c", 60, 0, 30))
	waiting(t, before+1)
	seen := time.Now()
	asleep(t, sleeping+1)
	released := time.Now()
	if r := one(t, ns, fmt.Sprintf(`{"op":"release","name":"timed","token":%d,"owner":"a"}`, num(t, held["token"]))); r["released"] != true {
		t.Fatal(r)
	}
	if r := <-won; r["acquired"] != true {
		t.Fatal(r)
	}
	answered := time.Since(start)
	got := waited(t, ns, "acquired", true)
	if got.count != 1 || got.sum < released.Sub(seen).Seconds() || got.sum > answered.Seconds() {
		t.Errorf("a waiter seen waiting %v before the release, answered %v after its call: %+v", released.Sub(seen), answered, got)
	}
}

// An acquire the API server could not carry out is an error, timed too.
func TestAFailedAcquireIsTimedAsAnError(t *testing.T) {
	ns := namespace(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := rest.CopyConfig(env.Config)
	gone.Host = "https://" + ln.Addr().String() // nobody answers there
	ln.Close()
	url, _, err := env.StartRoute(gone, route.AuthNone, ns)
	if err != nil {
		t.Fatal(err)
	}
	if code, out := call(t, url, "", body(ns, acquire("unreachable", "a", 60, 0))); code != http.StatusServiceUnavailable {
		t.Fatalf("answered %d %v, want 503", code, out)
	}
	if got := waited(t, ns, "error", false); got.count != 1 {
		t.Errorf("%v failed acquires timed, want 1", got.count)
	}
}

// The caller is an exemplar of the wait, never a label.
func TestAcquireWaitsNameTheCallerAsAnExemplar(t *testing.T) {
	applyFile(t, "config/rbac/holder_role.yaml")
	ns := namespace(t)
	tok := serviceAccount(t, ns, "timed", "queen-locks-holder")
	if code, out := call(t, tokenURL, tok, body(ns, acquire("exemplar", "a", 60, 0))); code != http.StatusOK {
		t.Fatalf("answered %d %v", code, out)
	}
	got := waited(t, ns, "acquired", false)
	want := "system:serviceaccount:" + ns + ":timed"
	if got.count != 1 || len(got.callers) != 1 || got.callers[0] != want {
		t.Errorf("exemplars name %v (count %v), want %s", got.callers, got.count, want)
	}
}

// Renews and releases answered lost, and checks that fail, are losses of
// their namespace; the ones that go through are not.
func TestLossesAreCountedByNamespace(t *testing.T) {
	ns := namespace(t)
	a := one(t, ns, acquire("lossy", "a", 60, 0))
	tok := num(t, a["token"])
	r := one(t, ns, renewOp("lossy", "a", tok))
	if r["renewed"] != true {
		t.Fatal(r)
	}
	fresh := num(t, r["token"])
	if r := one(t, ns, renewOp("lossy", "intruder", fresh)); r["reason"] != "lost" {
		t.Fatal(r)
	}
	if r := one(t, ns, releaseOp("lossy", "intruder", fresh)); r["reason"] != "lost" {
		t.Fatal(r)
	}
	if r := one(t, ns, fmt.Sprintf(`{"op":"check","name":"lossy","expect":%d}`, tok)); r["reason"] != "kv_precondition" {
		t.Fatal(r)
	}
	if r := one(t, ns, fmt.Sprintf(`{"op":"check","name":"lossy","expect":%d}`, fresh)); r["ok"] != true {
		t.Fatal(r)
	}
	if r := one(t, ns, releaseOp("lossy", "a", fresh)); r["released"] != true {
		t.Fatal(r)
	}
	for _, c := range []struct{ op, reason string }{{"renew", "lost"}, {"release", "lost"}, {"check", "kv_precondition"}} {
		if got := metric(t, "queen_locks_route_losses_total", map[string]string{"namespace": ns, "op": c.op, "reason": c.reason}); got.value != 1 {
			t.Errorf("%s %s counted %v times, want 1", c.op, c.reason, got.value)
		}
	}
}
