package route_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

func acquire(name, owner string, ttl, limit int) string {
	s := fmt.Sprintf(`{"op":"acquire","name":%q,"ttlSeconds":%d`, name, ttl)
	if owner != "" {
		s += fmt.Sprintf(`,"owner":%q`, owner)
	}
	if limit > 0 {
		s += fmt.Sprintf(`,"limit":%d`, limit)
	}
	return s + "}"
}

func TestAcquireWonAnswersThePermitAndItsGuard(t *testing.T) {
	ns := namespace(t)
	r := one(t, ns, acquire("daily-report", "cron-7", 30, 1))
	if got, want := keys(r), "acquired,expiresAt,guard,index,name,op,owner,slot,token"; got != want {
		t.Fatalf("keys %s, want %s: %v", got, want, r)
	}
	if r["acquired"] != true || r["op"] != "acquire" || r["name"] != "daily-report" || r["owner"] != "cron-7" || num(t, r["slot"]) != 0 || num(t, r["index"]) != 0 {
		t.Fatalf("answer %v", r)
	}
	ps := permits(t, ns)
	if len(ps) != 1 || ps[0].ResourceVersion != fmt.Sprint(num(t, r["token"])) {
		t.Fatalf("token %v is not the permit's resourceVersion (%v)", r["token"], ps)
	}
	if r["expiresAt"] != permit.FormatTime(ps[0].Spec.ExpireTime.Time) {
		t.Fatalf("expiresAt %v, permit's %v", r["expiresAt"], ps[0].Spec.ExpireTime)
	}
	g := r["guard"].(J)
	want := J{"op": "check", "ns": "queen-locks", "namespace": ns, "key": "daily-report#0", "expect": r["token"], "required": true}
	if fmt.Sprint(g) != fmt.Sprint(want) {
		t.Fatalf("guard %v, want %v", g, want)
	}
}

func TestAcquireByTheHolderAgainIsAlreadyAndWritesNothing(t *testing.T) {
	ns := namespace(t)
	first := one(t, ns, acquire("job", "cron-7", 30, 0))
	again := one(t, ns, acquire("job", "cron-7", 30, 0))
	if again["acquired"] != true || again["already"] != true || num(t, again["token"]) != num(t, first["token"]) || num(t, again["slot"]) != 0 {
		t.Fatalf("second acquire %v, first %v", again, first)
	}
	if ps := permits(t, ns); len(ps) != 1 || ps[0].ResourceVersion != fmt.Sprint(num(t, first["token"])) {
		t.Fatalf("the repeated acquire wrote: %v", ps)
	}
}

func TestAcquireHeldAnswersTheHolders(t *testing.T) {
	ns := namespace(t)
	won := one(t, ns, acquire("job", "a", 30, 0))
	r := one(t, ns, acquire("job", "b", 30, 0))
	if got, want := keys(r), "acquired,holders,index,name,op,reason,waiting"; got != want {
		t.Fatalf("keys %s, want %s: %v", got, want, r)
	}
	if r["acquired"] != false || r["reason"] != "held" || num(t, r["waiting"]) != 0 {
		t.Fatalf("answer %v", r)
	}
	hs := r["holders"].([]any)
	h := hs[0].(J)
	if len(hs) != 1 || keys(h) != "expiresAt,owner,renewedAt,since,slot,token" || h["owner"] != "a" ||
		num(t, h["token"]) != num(t, won["token"]) || h["expiresAt"] != won["expiresAt"] {
		t.Fatalf("holders %v", hs)
	}
}

func TestRenew(t *testing.T) {
	ns := namespace(t)
	won := one(t, ns, acquire("job", "a", 30, 0))
	tok := num(t, won["token"])
	r := one(t, ns, fmt.Sprintf(`{"op":"renew","name":"job","slot":0,"token":%d,"owner":"a","ttlSeconds":60}`, tok))
	if got, want := keys(r), "expiresAt,guard,index,name,op,renewed,token"; got != want {
		t.Fatalf("keys %s, want %s: %v", got, want, r)
	}
	newTok := num(t, r["token"])
	if r["renewed"] != true || newTok <= tok || num(t, r["guard"].(J)["expect"]) != newTok {
		t.Fatalf("renew %v after token %d", r, tok)
	}
	exp, _ := time.Parse(time.RFC3339Nano, r["expiresAt"].(string))
	if d := time.Until(exp); d < 50*time.Second || d > 61*time.Second {
		t.Fatalf("renew with ttlSeconds 60 expires in %v", d)
	}
	// The owner's stale token (its earlier renew landed) is carried through.
	r = one(t, ns, fmt.Sprintf(`{"op":"renew","name":"job","token":%d,"owner":"a","ttlSeconds":30}`, tok))
	if r["renewed"] != true || num(t, r["token"]) <= newTok {
		t.Fatalf("carried-through renew %v", r)
	}
	cur := num(t, r["token"])
	// Someone else's renew, even with the current token, is lost.
	for _, op := range []string{
		fmt.Sprintf(`{"op":"renew","name":"job","token":%d,"owner":"b"}`, cur),
		fmt.Sprintf(`{"op":"renew","name":"job","token":%d}`, tok),                  // no owner: needs the exact token
		fmt.Sprintf(`{"op":"renew","name":"job","token":%d,"owner":"a"}`, cur+1000), // a token from the future
		fmt.Sprintf(`{"op":"renew","name":"job","slot":1,"token":%d,"owner":"a"}`, cur),
		fmt.Sprintf(`{"op":"renew","name":"other","token":%d,"owner":"a"}`, cur),
	} {
		r := one(t, ns, op)
		if keys(r) != "index,name,op,reason,renewed" || r["renewed"] != false || r["reason"] != "lost" {
			t.Errorf("%s: %v, want renewed false, reason lost", op, r)
		}
	}
	// Without an owner, the exact token renews.
	r = one(t, ns, fmt.Sprintf(`{"op":"renew","name":"job","token":%d}`, cur))
	if r["renewed"] != true {
		t.Fatalf("owner-less renew with the exact token: %v", r)
	}
}

func TestRenewAfterExpiryIsLost(t *testing.T) {
	ns := namespace(t)
	won := one(t, ns, acquire("short", "a", 1, 0))
	exp, _ := time.Parse(time.RFC3339Nano, won["expiresAt"].(string))
	waitUntil(t, exp)
	r := one(t, ns, fmt.Sprintf(`{"op":"renew","name":"short","token":%d,"owner":"a"}`, num(t, won["token"])))
	if r["renewed"] != false || r["reason"] != "lost" {
		t.Fatalf("late renew %v", r)
	}
}

func TestReleaseGetCheck(t *testing.T) {
	ns := namespace(t)
	if r := one(t, ns, `{"op":"get","name":"job"}`); keys(r) != "holders,index,name,op,waiting" || len(r["holders"].([]any)) != 0 || num(t, r["waiting"]) != 0 {
		t.Fatalf("get of a free lock %v", r)
	}
	won := one(t, ns, acquire("job", "a", 30, 0))
	tok := num(t, won["token"])
	g := one(t, ns, `{"op":"get","name":"job"}`)
	if hs := g["holders"].([]any); len(hs) != 1 || num(t, hs[0].(J)["token"]) != tok {
		t.Fatalf("get %v", g)
	}
	if r := one(t, ns, fmt.Sprintf(`{"op":"check","name":"job","slot":0,"expect":%d}`, tok)); keys(r) != "index,name,ok,op" || r["ok"] != true {
		t.Fatalf("check with the current token %v", r)
	}
	for _, op := range []string{
		fmt.Sprintf(`{"op":"check","name":"job","expect":%d}`, tok-1),
		fmt.Sprintf(`{"op":"check","name":"job","slot":1,"expect":%d}`, tok),
		fmt.Sprintf(`{"op":"check","name":"free","expect":%d}`, tok),
	} {
		if r := one(t, ns, op); keys(r) != "index,name,ok,op,reason" || r["ok"] != false || r["reason"] != "kv_precondition" {
			t.Errorf("%s: %v", op, r)
		}
	}
	if r := one(t, ns, fmt.Sprintf(`{"op":"release","name":"job","slot":0,"token":%d,"owner":"b"}`, tok)); r["released"] != false || r["reason"] != "lost" {
		t.Fatalf("release by another owner %v", r)
	}
	if r := one(t, ns, fmt.Sprintf(`{"op":"release","name":"job","slot":0,"token":%d,"owner":"a"}`, tok)); keys(r) != "index,name,op,released" || r["released"] != true {
		t.Fatalf("release %v", r)
	}
	if len(permits(t, ns)) != 0 {
		t.Fatal("released permit still stored")
	}
	if r := one(t, ns, fmt.Sprintf(`{"op":"release","name":"job","token":%d,"owner":"a"}`, tok)); r["released"] != false || r["reason"] != "lost" {
		t.Fatalf("second release %v", r)
	}
	if r := one(t, ns, fmt.Sprintf(`{"op":"check","name":"job","expect":%d}`, tok)); r["ok"] != false {
		t.Fatalf("check after release %v", r)
	}
}

func TestOwnerlessAcquireMintsAnOwner(t *testing.T) {
	ns := namespace(t)
	r := one(t, ns, `{"op":"acquire","name":"anon","ttlSeconds":30}`)
	owner, _ := r["owner"].(string)
	if r["acquired"] != true || owner == "" {
		t.Fatalf("owner-less acquire %v", r)
	}
	// Its retry cannot be told from a stranger: held.
	if again := one(t, ns, `{"op":"acquire","name":"anon","ttlSeconds":30}`); again["reason"] != "held" {
		t.Fatalf("owner-less retry %v", again)
	}
	// The minted owner works like any other.
	if again := one(t, ns, acquire("anon", owner, 30, 0)); again["already"] != true {
		t.Fatalf("acquire with the minted owner %v", again)
	}
}

func TestSemaphoreAndTheLargerLimitRule(t *testing.T) {
	ns := namespace(t)
	// Owners start at a slot of their own (a hash of the owner), so which
	// slot each gets is not fixed; that each gets a different one is.
	slots := map[uint64]string{}
	for i := range 3 {
		r := one(t, ns, acquire("gpu", fmt.Sprint("w", i), 30, 3))
		if r["acquired"] != true || slots[num(t, r["slot"])] != "" {
			t.Fatalf("acquire %d of a semaphore of 3: %v (slots so far %v)", i, r, slots)
		}
		slots[num(t, r["slot"])] = fmt.Sprint("w", i)
	}
	full := one(t, ns, acquire("gpu", "w3", 30, 3))
	if full["reason"] != "held" || len(full["holders"].([]any)) != 3 {
		t.Fatalf("full semaphore %v", full)
	}
	// A caller with a smaller limit sees only the low slots.
	small := one(t, ns, acquire("gpu", "w4", 30, 2))
	if small["reason"] != "held" || len(small["holders"].([]any)) != 2 {
		t.Fatalf("limit 2 caller %v", small)
	}
	// Release slot 2: a limit-2 caller still cannot take it, a limit-3 one can.
	w2 := one(t, ns, `{"op":"get","name":"gpu"}`)["holders"].([]any)[2].(J)
	if r := one(t, ns, fmt.Sprintf(`{"op":"release","name":"gpu","slot":2,"token":%d,"owner":%q}`, num(t, w2["token"]), slots[2])); r["released"] != true {
		t.Fatalf("release %v", r)
	}
	if r := one(t, ns, acquire("gpu", "w4", 30, 2)); r["acquired"] != false {
		t.Fatalf("limit 2 caller took a slot: %v", r)
	}
	if r := one(t, ns, acquire("gpu", "w4", 30, 3)); r["acquired"] != true || num(t, r["slot"]) != 2 {
		t.Fatalf("limit 3 caller %v", r)
	}
	if ps := permits(t, ns); len(ps) != 3 {
		t.Fatalf("%d permits stored, want 3", len(ps))
	}
}

func TestOperationsAreIndependentAndAnsweredInOrder(t *testing.T) {
	ns := namespace(t)
	one(t, ns, acquire("taken", "x", 30, 0))
	rs := ops(t, ns, acquire("a", "me", 30, 0), acquire("taken", "me", 30, 0), `{"op":"get","name":"c"}`, acquire("b", "me", 30, 0))
	if len(rs) != 4 {
		t.Fatalf("%d results", len(rs))
	}
	for i, r := range rs {
		if num(t, r["index"]) != uint64(i) {
			t.Fatalf("result %d has index %v", i, r["index"])
		}
	}
	if rs[0]["acquired"] != true || rs[1]["reason"] != "held" || rs[2]["op"] != "get" || rs[3]["acquired"] != true {
		t.Fatalf("results %v", rs)
	}
}

func TestConcurrentAcquirersOfOneLockGiveOneWinner(t *testing.T) {
	ns := namespace(t)
	const n = 16
	won := make([]bool, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { won[i] = one(t, ns, acquire("race", fmt.Sprint("c", i), 30, 0))["acquired"] == true })
	}
	wg.Wait()
	winners := 0
	for _, w := range won {
		if w {
			winners++
		}
	}
	if winners != 1 || len(permits(t, ns)) != 1 {
		t.Fatalf("%d winners, %d permits; want 1", winners, len(permits(t, ns)))
	}
}

func TestConcurrentAcquirersOfASemaphoreNeverExceedItsLimit(t *testing.T) {
	ns := namespace(t)
	const n, limit = 20, 4
	slots := make([]any, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if r := one(t, ns, acquire("pool", fmt.Sprint("c", i), 30, limit)); r["acquired"] == true {
				slots[i] = r["slot"]
			} else if r["reason"] != "held" && r["reason"] != "contended" {
				t.Errorf("acquire %d: %v", i, r)
			}
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, s := range slots {
		if s != nil {
			if seen[fmt.Sprint(s)] {
				t.Fatalf("slot %v handed out twice", s)
			}
			seen[fmt.Sprint(s)] = true
		}
	}
	if len(seen) > limit || len(permits(t, ns)) > limit {
		t.Fatalf("%d holders, %d permits; limit %d", len(seen), len(permits(t, ns)), limit)
	}
	if len(seen) == 0 {
		t.Fatal("nobody acquired a free semaphore")
	}
}

func TestMethodAndSize(t *testing.T) {
	resp, err := http.Get(devURL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Fatalf("GET answered %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
	big := `{"operations":[{"op":"get","name":"` + strings.Repeat("a", 2<<20) + `"}]}`
	if code, out := call(t, devURL, "", big); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("2 MiB body answered %d: %v", code, out)
	}
}

func waitUntil(t *testing.T, at time.Time) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return !time.Now().Before(at), nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A gated pod's permit is the pod's for its whole life: a route caller who
// read its token cannot renew it, which would change the pod's fencing
// token under it and stretch (or cut short) its lifetime.
func TestARenewOfAGatedPodsPermitIsRefused(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	p := &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: permit.Name("gated", 0)},
		Spec: locksv1alpha1.QueenLockSpec{Lock: "gated", Limit: 1, Owner: permit.GateOwnerPrefix + "0000-a-pod", TTLSeconds: 300}}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	tok := p.ResourceVersion
	for _, op := range []string{
		`{"op":"renew","name":"gated","token":` + tok + `,"ttlSeconds":1}`,
		`{"op":"renew","name":"gated","token":` + tok + `}`,
	} {
		r := one(t, ns, op)
		if r["renewed"] != false || r["reason"] != "lost" {
			t.Fatalf("%s answered %v, want renewed false, reason lost", op, r)
		}
	}
	got := &locksv1alpha1.QueenLock{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != tok || got.Spec.TTLSeconds != 300 {
		t.Fatalf("the gated pod's permit was written: version %s ttl %d, was %s ttl 300", got.ResourceVersion, got.Spec.TTLSeconds, tok)
	}
}
