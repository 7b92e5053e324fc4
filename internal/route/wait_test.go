package route_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/locks/waiters"
)

func acquireWaiting(name, owner string, ttl, limit, waitSeconds int) string {
	return strings.TrimSuffix(acquire(name, owner, ttl, limit), "}") + fmt.Sprintf(`,"waitSeconds":%d}`, waitSeconds)
}

// waiting waits until n calls wait on the control plane's waker.
func waiting(t *testing.T, n int) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return env.Waker.Waiting() == n, nil
	}); err != nil {
		t.Fatalf("%d calls wait, want %d", env.Waker.Waiting(), n)
	}
}

// asleep waits until n waiters have lost their first try and sleep, so
// that what frees a slot next is what must wake them.
func asleep(t *testing.T, n int) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return env.Waker.Asleep() == n, nil
	}); err != nil {
		t.Fatalf("%d waiters asleep, want %d", env.Waker.Asleep(), n)
	}
}

// inBackground runs one call in the background and answers its result.
func inBackground(t *testing.T, ns, op string) <-chan J {
	t.Helper()
	ch := make(chan J, 1)
	go func() { ch <- ops(t, ns, op)[0] }()
	return ch
}

func TestAWaiterIsWokenWhenThePermitFrees(t *testing.T) {
	ns := namespace(t)
	frees := map[string]func(t *testing.T, held J){
		"release": func(t *testing.T, held J) {
			t.Helper()
			if r := one(t, ns, fmt.Sprintf(`{"op":"release","name":"w-release","token":%d,"owner":"a"}`, num(t, held["token"]))); r["released"] != true {
				t.Fatal(r)
			}
		},
		"kubectl delete": func(t *testing.T, held J) {
			t.Helper()
			p := permits(t, ns)
			for i := range p {
				if p[i].Spec.Lock == "w-delete" {
					if err := env.Client.Delete(t.Context(), &p[i]); err != nil {
						t.Fatal(err)
					}
				}
			}
		},
		"expiry": func(t *testing.T, held J) { t.Helper() }, // a 1 s lifetime runs out by itself
	}
	for how, free := range frees {
		t.Run(how, func(t *testing.T) {
			lock := map[string]string{"release": "w-release", "kubectl delete": "w-delete", "expiry": "w-expiry"}[how]
			ttl := 60
			if how == "expiry" {
				ttl = 1
			}
			held := one(t, ns, acquire(lock, "a", ttl, 0))
			if held["acquired"] != true {
				t.Fatal(held)
			}
			start := time.Now()
			got := inBackground(t, ns, acquireWaiting(lock, "b", 30, 0, 30))
			asleep(t, 1)
			free(t, held)
			r := <-got
			if r["acquired"] != true || r["owner"] != "b" {
				t.Fatalf("the waiter answered %v", r)
			}
			wokenBeforeItsWaitEnded(t, r, 30, start, 30*time.Second)
			waiting(t, 0)
			if how == "expiry" {
				// Woken no earlier than the holder's lease plus the grace.
				h := one(t, ns, fmt.Sprintf(`{"op":"get","name":%q}`, lock))["holders"].([]any)[0].(J)
				since, _ := time.Parse(time.RFC3339Nano, h["since"].(string))
				expired, _ := time.Parse(time.RFC3339Nano, held["expiresAt"].(string))
				if since.Before(expired.Add(env.Grace)) {
					t.Fatalf("taken over at %v, before %v plus the grace", since, expired)
				}
			}
		})
	}
}

// wokenBeforeItsWaitEnded fails when acquired came from the try a waiting
// acquire makes when its wait is over: a wake was lost. The margin is half
// the wait, so nothing here depends on how fast the machine is.
// ttl is the acquire's, in seconds: expiresAt less ttl is when the server
// admitted it.
func wokenBeforeItsWaitEnded(t *testing.T, acquired J, ttl int, start time.Time, wait time.Duration) {
	t.Helper()
	expires, err := time.Parse(time.RFC3339Nano, fmt.Sprint(acquired["expiresAt"]))
	if err != nil {
		t.Fatalf("expiresAt of %v: %v", acquired, err)
	}
	since := expires.Add(-time.Duration(ttl) * time.Second)
	if since.After(start.Add(wait / 2)) {
		t.Fatalf("acquired at %v, %v after the call: not woken, only its last try won", since, since.Sub(start))
	}
}

// A waiter that loses its try does not wake the next waiter, except one
// whose larger limit reaches a slot it could not: here the longest waiter
// has limit 2, the freed slot is beyond it, and the waiter of limit 4 must
// get it without waiting out its wait.
func TestAFreedSlotBeyondTheFirstWaitersLimitGoesToTheNext(t *testing.T) {
	ns := namespace(t)
	held := map[int]J{}
	for _, h := range []struct {
		owner string
		limit int
	}{{"low-a", 2}, {"low-b", 2}, {"high-a", 4}, {"high-b", 4}} {
		r := one(t, ns, acquire("w-mixed", h.owner, 60, h.limit))
		if r["acquired"] != true {
			t.Fatalf("%s: %v", h.owner, r)
		}
		held[int(num(t, r["slot"]))] = r
	}
	if len(held) != 4 {
		t.Fatalf("slots held: %v", held)
	}
	narrow := inBackground(t, ns, acquireWaiting("w-mixed", "narrow", 30, 2, 5))
	waiting(t, 1)
	start := time.Now()
	wide := inBackground(t, ns, acquireWaiting("w-mixed", "wide", 30, 4, 30))
	waiting(t, 2)
	// Both have made their first try and sleep: the release below is
	// what must wake the right one.
	asleep(t, 2)
	r := held[3]
	if rr := one(t, ns, fmt.Sprintf(`{"op":"release","name":"w-mixed","slot":3,"token":%d,"owner":%q}`, num(t, r["token"]), r["owner"])); rr["released"] != true {
		t.Fatal(rr)
	}
	got := <-wide
	if got["acquired"] != true || num(t, got["slot"]) != 3 {
		t.Fatalf("the waiter of limit 4 answered %v", got)
	}
	wokenBeforeItsWaitEnded(t, got, 30, start, 30*time.Second)
	if n := <-narrow; n["acquired"] == true {
		t.Fatalf("the waiter of limit 2 answered %v", n)
	}
}

func TestAWaitThatRunsOutAnswersHeld(t *testing.T) {
	ns := namespace(t)
	one(t, ns, acquire("w-out", "a", 60, 0))
	start := time.Now()
	r := one(t, ns, acquireWaiting("w-out", "b", 30, 0, 1))
	if r["acquired"] != false || r["reason"] != "held" || len(r["holders"].([]any)) != 1 {
		t.Fatalf("answer %v", r)
	}
	if time.Since(start) < time.Second {
		t.Fatalf("answered after %v, before the wait was over", time.Since(start))
	}
}

// A caller that goes away while waiting never acquires afterwards.
func TestAWaiterThatWentAwayNeverAcquires(t *testing.T) {
	ns := namespace(t)
	held := one(t, ns, acquire("w-gone", "a", 60, 0))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		body := `{"namespace":"` + ns + `","operations":[` + acquireWaiting("w-gone", "b", 60, 0, 30) + `]}`
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, devURL, strings.NewReader(body))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waiting(t, 1)
	cancel()
	<-done
	waiting(t, 0)
	one(t, ns, fmt.Sprintf(`{"op":"release","name":"w-gone","token":%d,"owner":"a"}`, num(t, held["token"])))
	if r := one(t, ns, acquire("w-gone", "c", 60, 0)); r["acquired"] != true || r["owner"] != "c" {
		t.Fatalf("after the waiter went away: %v", r)
	}
	for _, p := range permits(t, ns) {
		if p.Spec.Owner == "b" {
			t.Fatalf("the waiter that went away holds %s", p.Name)
		}
	}
}

// Past the cap, an acquire with a wait answers at once.
func TestTheWaitingCap(t *testing.T) {
	ns := namespace(t)
	hub := waiters.NewHub(1, env.Grace, nil)
	url, stop, err := env.StartRouteConfig(route.Config{Auth: route.AuthNone, DefaultNamespace: ns, Waker: hub})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	one(t, ns, acquire("w-cap", "a", 60, 0))
	body := func(owner string, w int) string {
		return `{"operations":[` + acquireWaiting("w-cap", owner, 60, 0, w) + `]}`
	}
	go func() { _, _ = call(t, url, "", body("b", 3)) }()
	if err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return hub.Waiting() == 1, nil
	}); err != nil {
		t.Fatal("the first waiter never waited")
	}
	start := time.Now()
	code, out := call(t, url, "", body("c", 30))
	r := out["results"].([]any)[0].(J)
	if code != http.StatusOK || r["reason"] != "held" || time.Since(start) > 20*time.Second {
		t.Fatalf("past the cap: %d %v after %v", code, out, time.Since(start))
	}
	if hub.Waiting() > 1 {
		t.Fatalf("%d waiting, cap 1", hub.Waiting())
	}
}

// 20 waiters on a semaphore of 4, each holding a moment and releasing:
// all get a turn, and never more than 4 hold at once.
func TestWaitersOnASemaphoreNeverExceedItsLimit(t *testing.T) {
	ns := namespace(t)
	const waiters, limit = 20, 4
	var holding, most atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan string, waiters)
	for i := range waiters {
		wg.Go(func() {
			owner := fmt.Sprint("w", i)
			r := ops(t, ns, acquireWaiting("w-sem", owner, 30, limit, 60))[0]
			if r["acquired"] != true {
				errs <- fmt.Sprintf("%s: %v", owner, r)
				return
			}
			n := holding.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			var list []string
			for _, p := range permits(t, ns) {
				if p.Spec.Lock == "w-sem" {
					list = append(list, p.Spec.Owner)
				}
			}
			if len(list) > limit {
				errs <- fmt.Sprintf("%d permits held: %v", len(list), list)
			}
			holding.Add(-1)
			if rr := one(t, ns, fmt.Sprintf(`{"op":"release","name":"w-sem","slot":%d,"token":%d,"owner":%q}`, num(t, r["slot"]), num(t, r["token"]), owner)); rr["released"] != true {
				errs <- fmt.Sprintf("%s release: %v", owner, rr)
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if most.Load() > limit {
		t.Fatalf("%d held at once", most.Load())
	}
}

func TestMalformedWaitSecondsIsRefusedWhole(t *testing.T) {
	ns := namespace(t)
	for _, v := range []string{"-1", "1.5", `"5"`, "61", "null", "true"} {
		body := `{"namespace":"` + ns + `","operations":[` + acquire("w-ok", "a", 30, 0) + `,{"op":"acquire","name":"w-bad","ttlSeconds":30,"waitSeconds":` + v + `}]}`
		code, out := call(t, devURL, "", body)
		e, _ := out["error"].(J)
		if code != http.StatusBadRequest || e["field"] != "waitSeconds" || num(t, e["index"]) != 1 {
			t.Fatalf("waitSeconds %s answered %d: %v", v, code, out)
		}
	}
	var n int
	for _, p := range permits(t, ns) {
		if p.Spec.Lock == "w-ok" {
			n++
		}
	}
	if n != 0 {
		t.Fatal("a refused call applied an operation")
	}
}

// A caller that leaves while one of its acquires waits receives none of
// the call's answers. What the call won for an operation that named no
// owner is given back: nobody can learn that owner. What it won for the
// caller's own owner is kept: the caller's retry converges on it (already),
// or its TTL ends it.
func TestACallWhoseCallerLeftGivesBackItsOtherAcquires(t *testing.T) {
	ns := namespace(t)
	one(t, ns, acquire("w-busy", "a", 60, 0))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		// w-own comes before w-side: the give-back goes in order, so once
		// w-side is gone, w-own has been passed over for good.
		body := `{"namespace":"` + ns + `","operations":[` + acquireWaiting("w-busy", "b", 60, 0, 30) + `,` + acquire("w-own", "b", 60, 0) + `,` + acquire("w-side", "", 60, 0) + `]}`
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, devURL, strings.NewReader(body))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	held := func(lock string) bool {
		for _, p := range permits(t, ns) {
			if p.Spec.Lock == lock {
				return true
			}
		}
		return false
	}
	// The operations of one call run side by side: the caller leaves only
	// once both acquires are stored, or a give-back not yet due would pass
	// for one that happened.
	waiting(t, 1)
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return held("w-own") && held("w-side"), nil
	}); err != nil {
		t.Fatal("the call's two plain acquires were never stored")
	}
	cancel()
	<-done
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return !held("w-side"), nil
	}); err != nil {
		t.Fatal("the acquire of a minted owner, in a call whose caller left, is still held")
	}
	if !held("w-own") {
		t.Fatal("the acquire with the caller's own owner was given back: the caller's retry would find its lock gone")
	}
}
