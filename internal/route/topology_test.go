package route_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/permit"
)

// The tests here run in the chart's topology (controlplane.Topology): two
// replicas behind one address, the caller's pod-bound token, a quota on
// the locks' namespace and the caller's pod in another namespace.

// results calls url as tp's pod and answers the results, failing unless
// the call answered 200.
func results(t *testing.T, tp *controlplane.Topology, url string, operations ...string) []J {
	t.Helper()
	code, out := call(t, url, tp.Token, body(tp.LockNS, operations...))
	if code != http.StatusOK {
		t.Fatalf("answered %d: %v", code, out)
	}
	var rs []J
	for _, r := range out["results"].([]any) {
		rs = append(rs, r.(J))
	}
	return rs
}

func renewOp(name, owner string, token uint64) string {
	return fmt.Sprintf(`{"op":"renew","name":%q,"slot":0,"token":%d,"owner":%q,"ttlSeconds":600}`, name, token, owner)
}

func releaseOp(name, owner string, token uint64) string {
	return fmt.Sprintf(`{"op":"release","name":%q,"slot":0,"token":%d,"owner":%q}`, name, token, owner)
}

func permitOf(t *testing.T, ns, lock string) (*locksv1alpha1.QueenLock, bool) {
	t.Helper()
	p := &locksv1alpha1.QueenLock{}
	err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: permit.Name(lock, 0)}, p)
	if client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	return p, err == nil
}

// A pod of one namespace that holds a lock in another keeps it while it
// lives, loses it soon after it is deleted, and a pod of the same name in
// the lock's namespace has nothing to do with it.
func TestAPodHoldsALockInAnotherNamespace(t *testing.T) {
	tp := env.Production(t, controlplane.TopologyOptions{})
	ctx := context.Background()
	got := results(t, tp, tp.URL, acquire("nightly", "", 600, 0))[0]
	if got["acquired"] != true {
		t.Fatalf("acquire: %v", got)
	}
	p, ok := permitOf(t, tp.LockNS, "nightly")
	if !ok {
		t.Fatal("no permit after the acquire")
	}
	want := locksv1alpha1.PodRef{Namespace: tp.PodNS, Name: tp.Pod.Name, UID: string(tp.Pod.UID)}
	if p.Spec.HolderPod == nil || *p.Spec.HolderPod != want {
		t.Fatalf("holderPod %+v, want %+v", p.Spec.HolderPod, want)
	}

	// A pod of the same name in the lock's namespace, created and deleted,
	// is another pod: it neither frees the permit nor keeps it.
	namesake := env.Pod(t, tp.LockNS, tp.Pod.Name, "")
	if err := env.Client.Delete(ctx, namesake); err != nil {
		t.Fatal(err)
	}
	// The holder lives: the permit (TTL 10 minutes) must stay, unchanged,
	// for the whole of a 10 s window in which a wrongly followed pod would
	// have freed it within a second or two.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		now, ok := permitOf(t, tp.LockNS, "nightly")
		if !ok || now.ResourceVersion != p.ResourceVersion {
			t.Fatalf("the permit of a live pod of %s changed or went (exists %v) while that pod lives", tp.PodNS, ok)
		}
		time.Sleep(250 * time.Millisecond)
	}

	if err := env.Client.Delete(ctx, tp.Pod); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 2*time.Second, true, func(context.Context) (bool, error) {
		_, ok := permitOf(t, tp.LockNS, "nightly")
		return !ok, nil
	})
	if err != nil {
		t.Fatalf("the permit was not freed within 2 s of its pod's deletion")
	}
	t.Logf("freed %v after the pod was deleted", time.Since(start).Round(time.Millisecond))
}

// A renew whose answer was lost, retried with the old token on the other
// replica, is carried through; so is a release. Tokens of an earlier
// holding stay lost on both replicas.
func TestARetryReachingTheOtherReplicaIsCarriedThrough(t *testing.T) {
	tp := env.Production(t, controlplane.TopologyOptions{})
	r0, r1 := tp.Replicas[0], tp.Replicas[1]

	t.Run("renew", func(t *testing.T) {
		a := results(t, tp, r0, acquire("report", "cron-7", 600, 0))[0]
		t1 := num(t, a["token"])
		dropped := results(t, tp, r0, renewOp("report", "cron-7", t1))[0] // its answer is "lost"
		if dropped["renewed"] != true {
			t.Fatalf("renew: %v", dropped)
		}
		retry := results(t, tp, r1, renewOp("report", "cron-7", t1))[0]
		cur, _ := permitOf(t, tp.LockNS, "report")
		if retry["renewed"] != true || fmt.Sprint(num(t, retry["token"])) != cur.ResourceVersion || num(t, retry["token"]) <= num(t, dropped["token"]) {
			t.Fatalf("retry on the other replica: %v, want renewed with the current token %s", retry, cur.ResourceVersion)
		}
		// And back on the first replica, with the first token again.
		again := results(t, tp, r0, renewOp("report", "cron-7", t1))[0]
		if again["renewed"] != true {
			t.Fatalf("a second retry on the first replica: %v", again)
		}
	})

	t.Run("release", func(t *testing.T) {
		for i, pair := range [][2]string{{r0, r1}, {r1, r0}} {
			lock := fmt.Sprintf("sync-%d", i)
			a := results(t, tp, pair[0], acquire(lock, "w", 600, 0))[0]
			t1 := num(t, a["token"])
			results(t, tp, pair[0], renewOp(lock, "w", t1))
			rel := results(t, tp, pair[1], releaseOp(lock, "w", t1))[0]
			if rel["released"] != true {
				t.Fatalf("a release with the stale token on the other replica: %v", rel)
			}
			if _, ok := permitOf(t, tp.LockNS, lock); ok {
				t.Fatal("the permit is still there after the release")
			}
		}
	})

	t.Run("an earlier holding's token stays lost", func(t *testing.T) {
		a := results(t, tp, r0, acquire("migrate", "w", 600, 0))[0]
		old := num(t, a["token"])
		results(t, tp, r0, renewOp("migrate", "w", old))
		if rel := results(t, tp, r1, releaseOp("migrate", "w", old))[0]; rel["released"] != true {
			t.Fatalf("release: %v", rel)
		}
		// The same owner acquires again: a new holding, renewed once so that
		// it has a recorded first token.
		b := results(t, tp, r1, acquire("migrate", "w", 600, 0))[0]
		results(t, tp, r1, renewOp("migrate", "w", num(t, b["token"])))
		for _, r := range []string{r0, r1} {
			if got := results(t, tp, r, renewOp("migrate", "w", old))[0]; got["renewed"] != false || got["reason"] != "lost" {
				t.Fatalf("renew with the earlier holding's token: %v, want lost", got)
			}
			if got := results(t, tp, r, releaseOp("migrate", "w", old))[0]; got["released"] != false || got["reason"] != "lost" {
				t.Fatalf("release with the earlier holding's token: %v, want lost", got)
			}
		}
	})

	t.Run("a token from before a takeover stays lost", func(t *testing.T) {
		a := results(t, tp, r0, `{"op":"acquire","name":"short","ttlSeconds":1,"owner":"w"}`)[0]
		old := num(t, a["token"])
		// Taken over (or freed by the controller and acquired again) by the
		// same owner once it expired, then renewed.
		var b J
		err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 10*time.Second, false, func(context.Context) (bool, error) {
			b = results(t, tp, r1, acquire("short", "w", 600, 0))[0]
			return b["acquired"] == true && b["already"] != true, nil
		})
		if err != nil {
			t.Fatalf("never acquired again after the expiry: %v", b)
		}
		results(t, tp, r1, renewOp("short", "w", num(t, b["token"])))
		for _, r := range []string{r0, r1} {
			if got := results(t, tp, r, renewOp("short", "w", old))[0]; got["renewed"] != false || got["reason"] != "lost" {
				t.Fatalf("renew with a token from before the takeover: %v, want lost", got)
			}
		}
	})
}

// In a namespace whose quota is used up, a holder's retry answers already,
// another owner held, and only a lock that needs a new permit quota.
func TestAQuotaUsedUpStillAnswersWhoHolds(t *testing.T) {
	tp := env.Production(t, controlplane.TopologyOptions{Quota: 1})
	a := results(t, tp, tp.URL, acquire("only", "w", 600, 0))[0]
	if a["acquired"] != true {
		t.Fatalf("acquire within the quota: %v", a)
	}
	retry := results(t, tp, tp.URL, acquire("only", "w", 600, 0))[0]
	if retry["acquired"] != true || retry["already"] != true || num(t, retry["token"]) != num(t, a["token"]) {
		t.Fatalf("the holder's retry: %v, want already with token %v", retry, a["token"])
	}
	other := results(t, tp, tp.URL, acquire("only", "x", 600, 0))[0]
	hs, _ := other["holders"].([]any)
	if other["acquired"] != false || other["reason"] != "held" || len(hs) != 1 || hs[0].(J)["owner"] != "w" {
		t.Fatalf("another owner: %v, want held by w", other)
	}
	sem := results(t, tp, tp.URL, acquire("only", "y", 600, 3))[0]
	if sem["acquired"] != false || sem["reason"] != "quota" {
		t.Fatalf("a semaphore acquire that needs a new permit: %v, want quota", sem)
	}
	fresh := results(t, tp, tp.URL, acquire("fresh", "w", 600, 0))[0]
	if fresh["acquired"] != false || fresh["reason"] != "quota" {
		t.Fatalf("a new lock: %v, want quota", fresh)
	}
	semRetry := results(t, tp, tp.URL, acquire("only", "w", 600, 3))[0]
	if semRetry["acquired"] != true || semRetry["already"] != true {
		t.Fatalf("the holder's retry as a semaphore: %v, want already", semRetry)
	}
}
