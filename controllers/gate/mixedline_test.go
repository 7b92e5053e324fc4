package gate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/locks/waiters"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/permit/gatedpod"
)

// routeCall posts one operation to a route of auth none, from any
// goroutine, and answers its result.
func routeCall(ctx context.Context, url, ns, op string) (map[string]any, error) {
	body := fmt.Sprintf(`{"namespace":%q,"operations":[%s]}`, ns, op)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out struct{ Results []map[string]any }
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&out); err != nil || resp.StatusCode != http.StatusOK || len(out.Results) != 1 {
		return nil, fmt.Errorf("answer %d: %q", resp.StatusCode, raw)
	}
	return out.Results[0], nil
}

// waitersOf waits until the API server holds n waiters of lock.
func waitersOf(t *testing.T, ns, lock string, n int) {
	t.Helper()
	count := func() int {
		ws, err := locks.New(env.Client, nil).Line(context.Background(), ns, lock)
		if err != nil {
			t.Fatal(err)
		}
		return len(ws)
	}
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return count() == n, nil
	}); err != nil {
		t.Fatalf("%d waiters of %s, want %d", count(), lock, n)
	}
}

// Gated pods wait in the same line as the route's waiters (on two
// replicas) and a waiter straight over the Kubernetes API: ten waiters,
// each in the line before the next comes, get the lock in the order they
// came as it passes from one to the next.
func TestGatedPodsShareTheLineWithEveryOtherWaiter(t *testing.T) {
	ns := entitledNamespace(t)
	ctx := t.Context()
	urls := [2]string{}
	for i := range urls {
		urls[i], _ = env.ServeRoute(t, route.AuthNone, ns)
	}
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: manager.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	direct := locks.New(wc, nil, locks.WithGrace(env.Grace))
	const lock = "shared"
	held, err := routeCall(ctx, urls[0], ns, `{"op":"acquire","name":"shared","owner":"holder","ttlSeconds":600}`)
	if err != nil || held["acquired"] != true {
		t.Fatal(held, err)
	}

	const n = 10
	type result struct {
		token string
		err   error
	}
	got := make([]chan result, n)
	pods := map[int]string{}
	var released sync.WaitGroup
	defer released.Wait()
	for i := range n {
		got[i] = make(chan result, 1)
		owner := fmt.Sprintf("waiter-%d", i)
		switch i % 4 {
		case 0, 2:
			url := urls[i%4/2]
			released.Add(1)
			go func() {
				defer released.Done()
				r, err := routeCall(ctx, url, ns, fmt.Sprintf(`{"op":"acquire","name":"shared","owner":%q,"ttlSeconds":600,"waitSeconds":60}`, owner))
				if err == nil && r["acquired"] != true {
					err = fmt.Errorf("waiter %d answered %v", i, r)
				}
				if err != nil {
					got[i] <- result{err: err}
					return
				}
				got[i] <- result{token: fmt.Sprint(r["token"])}
				_, err = routeCall(ctx, url, ns, fmt.Sprintf(`{"op":"release","name":"shared","token":%v,"owner":%q}`, r["token"], owner))
				if err != nil {
					t.Errorf("waiter %d releasing: %v", i, err)
				}
			}()
		case 1:
			pods[i] = fmt.Sprintf("pod-%d", i)
			gated(t, ns, pods[i], lock)
		case 3:
			released.Add(1)
			go func() {
				defer released.Done()
				a, err := direct.Acquire(ctx, ns, lock, owner, 600, 1, locks.WaitUpTo(time.Minute, waiters.Watcher{C: wc, Grace: env.Grace}))
				if err == nil && !a.Acquired {
					err = fmt.Errorf("waiter %d answered %+v", i, a)
				}
				if err != nil {
					got[i] <- result{err: err}
					return
				}
				got[i] <- result{token: fmt.Sprint(a.Token)}
				if _, err := direct.Release(ctx, ns, lock, a.Slot, a.Token, owner); err != nil {
					t.Errorf("waiter %d releasing: %v", i, err)
				}
			}()
		}
		waitersOf(t, ns, lock, i+1)
	}

	if r, err := routeCall(ctx, urls[1], ns, fmt.Sprintf(`{"op":"release","name":"shared","token":%v,"owner":"holder"}`, held["token"])); err != nil || r["released"] != true {
		t.Fatal(r, err)
	}
	var last uint64
	for i := range n {
		var tok uint64
		if name, ok := pods[i]; ok {
			p := admitted(t, ns, name)
			tok = token(t, p)
			finish(t, p)
		} else {
			r := <-got[i]
			if r.err != nil {
				t.Fatal(r.err)
			}
			if _, err := fmt.Sscan(r.token, &tok); err != nil {
				t.Fatal(err)
			}
		}
		if tok <= last {
			t.Fatalf("waiter %d got token %d, not above the %d of the waiter before it", i, tok, last)
		}
		last = tok
	}
	released.Wait()
	waitersOf(t, ns, lock, 0)
}

// A gated pod deleted while it waits leaves the line, and the waiter
// behind it moves up: its waiter object goes with it.
func TestADeletedGatedPodLeavesTheLine(t *testing.T) {
	ns := entitledNamespace(t)
	ctx := t.Context()
	l := locks.New(env.Client, nil)
	if a, err := l.Acquire(ctx, ns, "nightly", "holder", 600, 1); err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	p := gated(t, ns, "early", "nightly")
	waitersOf(t, ns, "nightly", 1)
	remove(t, p)
	waitersOf(t, ns, "nightly", 0)
}

// A gated pod that joins the line of a free lock just after another
// waiter waits behind it, however fresh: the gate weighs a pod against
// the line only once its cache shows the pod's own waiter, and then it
// shows every waiter ahead of it. Ten rounds, each with a waiter created
// straight before the pod, as a route call that joined a moment earlier.
func TestAGatedPodWaitsBehindAWaiterThatJoinedJustBefore(t *testing.T) {
	ns := entitledNamespace(t)
	ctx := t.Context()
	for round := range 10 {
		lock := fmt.Sprintf("fresh-%d", round)
		w := &locksv1alpha1.QueenLockWaiter{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: lock + "-", Labels: map[string]string{permit.LockLabel: permit.LabelValue(lock)}},
			Spec:       locksv1alpha1.QueenLockWaiterSpec{Lock: lock, Owner: "first", Limit: 1, TTLSeconds: 300},
		}
		if err := env.Client.Create(ctx, w); err != nil {
			t.Fatal(err)
		}
		p := gated(t, ns, "pod-"+lock, lock)
		told(t, p, "Waiting", "")
		if got, _ := get(t, ns, p.Name); !gatedpod.Gated(got) {
			t.Fatalf("round %d: the pod was let in ahead of a waiter that joined before it", round)
		}
		if err := env.Client.Delete(ctx, w); err != nil {
			t.Fatal(err)
		}
		finish(t, admitted(t, ns, p.Name))
	}
}
