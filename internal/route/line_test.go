package route_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/locks/waiters"
)

// line reads the line of lock in ns from the API server, in its order.
func line(t *testing.T, ns, lock string) []locksv1alpha1.QueenLockWaiter {
	t.Helper()
	ws, err := locks.New(env.Client, nil).Line(context.Background(), ns, lock)
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

// lineOf waits until the API server holds n waiters of lock.
func lineOf(t *testing.T, ns, lock string, n int) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return len(line(t, ns, lock)) == n, nil
	})
	if err != nil {
		t.Fatalf("%d waiters of %s, want %d", len(line(t, ns, lock)), lock, n)
	}
}

// postAsync posts body to url with a bearer token, from any goroutine.
func postAsync(ctx context.Context, url, token, body string) (J, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out J
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("answer %d: %q", resp.StatusCode, raw)
	}
	return out["results"].([]any)[0].(J), nil
}

// served is one waiter's acquire: who, and the token it got.
type served struct {
	who   int
	token uint64
	err   error
}

// Ten waiters join the line one after the other (each seen by the API
// server before the next starts), over both route replicas and straight
// over the Kubernetes API (the Go handle's transport), while the lock or
// every slot of a semaphore of 3 is held. A plain acquire meanwhile
// answers held with the line's length, as does get. When the holders
// release, each waiter takes a slot and at once gives it back: the tokens
// they got, the API server's order of their acquires, are in the order
// they joined.
func TestWaitersAcquireInTheOrderTheyJoined(t *testing.T) {
	for _, limit := range []int{1, 3} {
		t.Run(fmt.Sprintf("limit %d", limit), func(t *testing.T) {
			tp := env.Production(t, controlplane.TopologyOptions{})
			lock := fmt.Sprintf("line-%d", limit)
			ctx := t.Context()
			wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: manager.Scheme})
			if err != nil {
				t.Fatal(err)
			}
			direct := locks.New(wc, nil, locks.WithGrace(env.Grace))
			var holders []J
			for h := range limit {
				r := results(t, tp, tp.URL, acquire(lock, fmt.Sprintf("holder-%d", h), 600, limit))[0]
				if r["acquired"] != true {
					t.Fatalf("holder %d: %v", h, r)
				}
				holders = append(holders, r)
			}
			const n = 10
			got := make(chan served, n)
			var released sync.WaitGroup
			defer released.Wait()
			for i := range n {
				owner := fmt.Sprintf("waiter-%d", i)
				switch transport := i % 3; transport {
				case 0, 1:
					url := tp.Replicas[transport]
					released.Add(1)
					go func() {
						defer released.Done()
						r, err := postAsync(ctx, url, tp.Token, body(tp.LockNS, acquireWaiting(lock, owner, 600, limit, 60)))
						if err == nil && r["acquired"] != true {
							err = fmt.Errorf("waiter %d answered %v", i, r)
						}
						if err != nil {
							got <- served{who: i, err: err}
							return
						}
						tok, _ := strconv.ParseUint(fmt.Sprint(r["token"]), 10, 64)
						got <- served{who: i, token: tok}
						_, err = postAsync(ctx, url, tp.Token, body(tp.LockNS,
							fmt.Sprintf(`{"op":"release","name":%q,"slot":%v,"token":%d,"owner":%q}`, lock, r["slot"], tok, owner)))
						if err != nil {
							t.Errorf("waiter %d releasing: %v", i, err)
						}
					}()
				default:
					released.Add(1)
					go func() {
						defer released.Done()
						a, err := direct.Acquire(ctx, tp.LockNS, lock, owner, 600, limit, locks.WaitUpTo(time.Minute, waiters.Watcher{C: wc, Grace: env.Grace}))
						if err == nil && !a.Acquired {
							err = fmt.Errorf("waiter %d answered %+v", i, a)
						}
						if err != nil {
							got <- served{who: i, err: err}
							return
						}
						got <- served{who: i, token: a.Token}
						if _, err := direct.Release(ctx, tp.LockNS, lock, a.Slot, a.Token, owner); err != nil {
							t.Errorf("waiter %d releasing: %v", i, err)
						}
					}()
				}
				lineOf(t, tp.LockNS, lock, i+1)
			}
			ws := line(t, tp.LockNS, lock)
			for i, w := range ws {
				if want := fmt.Sprintf("waiter-%d", i); w.Spec.Owner != want {
					t.Fatalf("place %d of the line is %s, want %s", i+1, w.Spec.Owner, want)
				}
			}

			r := results(t, tp, tp.URL, acquire(lock, "plain", 600, limit))[0]
			if r["acquired"] != false || r["reason"] != "held" || num(t, r["waiting"]) != n {
				t.Fatalf("a plain acquire while %d wait answered %v", n, r)
			}
			if r := results(t, tp, tp.URL, fmt.Sprintf(`{"op":"get","name":%q}`, lock))[0]; num(t, r["waiting"]) != n {
				t.Fatalf("get while %d wait answered %v", n, r)
			}

			for h, r := range holders {
				if r := results(t, tp, tp.URL, fmt.Sprintf(`{"op":"release","name":%q,"slot":%v,"token":%v,"owner":"holder-%d"}`, lock, r["slot"], r["token"], h))[0]; r["released"] != true {
					t.Fatalf("holder %d released: %v", h, r)
				}
			}
			var order []served
			for range n {
				s := <-got
				if s.err != nil {
					t.Fatal(s.err)
				}
				order = append(order, s)
			}
			slices.SortFunc(order, func(a, b served) int { return int(a.token) - int(b.token) })
			var whos []int
			for _, s := range order {
				whos = append(whos, s.who)
			}
			if !slices.IsSorted(whos) {
				t.Fatalf("waiters acquired in the order %v (by token), want 0 to %d", whos, n-1)
			}
			released.Wait()
			lineOf(t, tp.LockNS, lock, 0)
		})
	}
}

// apiRequests reads kube-apiserver's count of the requests it served on
// the lock kinds, by "VERB resource".
func apiRequests(t *testing.T) map[string]float64 {
	t.Helper()
	out, err := env.APIRequests(context.Background(), "queenlocks", "queenlockwaiters")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func requestsSince(before, after map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for k, v := range after {
		if n := v - before[k]; n != 0 {
			d[k] = n
		}
	}
	return d
}

// The line costs the fast path nothing: an acquire of a free lock nobody
// waits for is one create of the permit over the route, waiting or not,
// and nothing touches the line.
//
// kube-apiserver counts every client's requests, and the suite's manager
// runs beside the test (expiring and giving back other tests' permits): a
// count can only gain from them. The acquire is measured a few times, each
// of a lock of its own, and one count of exactly one create must show;
// an acquire that read or wrote more would show it in every count.
func TestAnAcquireOfAFreeLockNobodyWaitsForIsOneWrite(t *testing.T) {
	ns := namespace(t)
	want := map[string]float64{"POST queenlocks": 1}
	for i, waits := range []bool{false, true} {
		var seen []map[string]float64
		for try := range 5 {
			op := acquire(fmt.Sprintf("fast-%d-%d", i, try), "a", 600, 0)
			if waits {
				op = acquireWaiting(fmt.Sprintf("fast-%d-%d", i, try), "a", 600, 0, 30)
			}
			before := apiRequests(t)
			if r := one(t, ns, op); r["acquired"] != true {
				t.Fatalf("acquire %d: %v", i, r)
			}
			got := requestsSince(before, apiRequests(t))
			if fmt.Sprint(got) == fmt.Sprint(want) {
				seen = nil
				break
			}
			seen = append(seen, got)
		}
		if seen != nil {
			t.Fatalf("acquire %d of a free lock: requests %v in each of %d tries, want %v", i, seen, len(seen), want)
		}
	}
}

// A waiter whose caller hangs up leaves the line at once; one whose route
// replica can no longer reach the API server (as a replica that died)
// stops renewing its waiter, which the manager removes within seconds. In
// both cases the next waiter gets the lock when it frees.
func TestAWaiterWhoseCarrierIsGoneLeavesTheLine(t *testing.T) {
	cut := make(chan struct{})
	tp := env.Production(t, controlplane.TopologyOptions{Replica: func(i int, c *route.Config) {
		if i == 1 {
			c.REST.Wrap(func(rt http.RoundTripper) http.RoundTripper { return cutter{rt: rt, cut: cut} })
		}
	}})
	ctx := t.Context()
	held := results(t, tp, tp.URL, acquire("carried", "holder", 600, 0))[0]
	if held["acquired"] != true {
		t.Fatal(held)
	}

	// The caller hangs up.
	hang, hangUp := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := postAsync(hang, tp.Replicas[0], tp.Token, body(tp.LockNS, acquireWaiting("carried", "hangs-up", 600, 0, 60)))
		done <- err
	}()
	lineOf(t, tp.LockNS, "carried", 1)
	start := time.Now()
	hangUp()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the call that hung up answered %v", err)
	}
	lineOf(t, tp.LockNS, "carried", 0)
	t.Logf("a waiter whose caller hung up left the line %v after", time.Since(start).Round(time.Millisecond))

	// The replica is cut off from the API server while its waiter waits.
	cutCall, endCutCall := context.WithCancel(ctx)
	defer endCutCall()
	go func() {
		_, err := postAsync(cutCall, tp.Replicas[1], tp.Token, body(tp.LockNS, acquireWaiting("carried", "cut-off", 600, 0, 60)))
		done <- err
	}()
	lineOf(t, tp.LockNS, "carried", 1)
	next := make(chan J, 1)
	go func() {
		r, err := postAsync(ctx, tp.Replicas[0], tp.Token, body(tp.LockNS, acquireWaiting("carried", "next", 600, 0, 60)))
		if err != nil {
			r = J{"error": err.Error()}
		}
		next <- r
	}()
	lineOf(t, tp.LockNS, "carried", 2)
	start = time.Now()
	close(cut)
	lineOf(t, tp.LockNS, "carried", 1)
	t.Logf("a waiter whose replica was cut off left the line %v after", time.Since(start).Round(time.Millisecond))
	if ws := line(t, tp.LockNS, "carried"); ws[0].Spec.Owner != "next" {
		t.Fatalf("the line is %v, want only next", ws)
	}
	if r := results(t, tp, tp.Replicas[0], fmt.Sprintf(`{"op":"release","name":"carried","token":%v,"owner":"holder"}`, held["token"]))[0]; r["released"] != true {
		t.Fatal(r)
	}
	if r := <-next; r["acquired"] != true || r["owner"] != "next" {
		t.Fatalf("the next waiter answered %v", r)
	}
}

// cutter fails every request once cut is closed: a replica that can no
// longer reach the API server.
type cutter struct {
	rt  http.RoundTripper
	cut chan struct{}
}

func (c cutter) RoundTrip(r *http.Request) (*http.Response, error) {
	select {
	case <-c.cut:
		return nil, fmt.Errorf("cut off from the API server")
	default:
		return c.rt.RoundTrip(r)
	}
}

// What an acquire that waits its turn writes: its first try (a create that
// loses), its waiter's create, its winning create and its waiter's delete,
// and a renew of its waiter for each 2 s it waits; the holder's release is
// the one delete of a permit.
func TestWhatAWaitingAcquireWrites(t *testing.T) {
	ns := namespace(t)
	// kube-apiserver counts every client's requests, and the suite's
	// manager expires and gives back other tests' permits beside this
	// one: a count can only gain from them. One of a few tries, each of
	// a lock of its own, must count exactly what a waiting acquire does.
	var seen []map[string]float64
	for try := range 4 {
		lock := fmt.Sprintf("costly-%d", try)
		held := one(t, ns, acquire(lock, "holder", 600, 0))
		if held["acquired"] != true {
			t.Fatal(held)
		}
		before := apiRequests(t)
		got := inBackground(t, ns, acquireWaiting(lock, "waiter", 600, 0, 30))
		lineOf(t, ns, lock, 1)
		if r := one(t, ns, fmt.Sprintf(`{"op":"release","name":%q,"token":%d,"owner":"holder"}`, lock, num(t, held["token"]))); r["released"] != true {
			t.Fatal(r)
		}
		if r := <-got; r["acquired"] != true {
			t.Fatalf("the waiter answered %v", r)
		}
		lineOf(t, ns, lock, 0)
		d := requestsSince(before, apiRequests(t))
		if d["POST queenlocks"] != 2 || d["POST queenlockwaiters"] != 1 || d["DELETE queenlockwaiters"] != 1 || d["DELETE queenlocks"] != 1 || d["PUT queenlocks"] != 0 {
			seen = append(seen, d)
			continue
		}
		writes := 0.0
		for k, v := range d {
			if !strings.HasPrefix(k, "LIST") && !strings.HasPrefix(k, "GET") && !strings.HasPrefix(k, "WATCH") {
				writes += v
			}
		}
		t.Logf("a waiting acquire wrote %v times (with %v renews of its waiter), besides the holder's release: %v", writes-1, d["PATCH queenlockwaiters"], d)
		return
	}
	t.Fatalf("requests %v in each try, want two creates of the permit (one lost), a create and a delete of the waiter, the release's delete", seen)
}
