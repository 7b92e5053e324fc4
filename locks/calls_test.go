package locks_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/locks/waiters"
	"github.com/queen-locks/queen-locks/permit"
)

// counting is the real API server, with a count of the calls made to it.
type counting struct {
	client.Client
	mu    sync.Mutex
	calls []string
	// stored counts the writes the API server stored (answered without
	// an error): a create that lost to an existing name stores nothing.
	stored int
}

func (c *counting) wrote(err error) error {
	if err == nil {
		c.mu.Lock()
		c.stored++
		c.mu.Unlock()
	}
	return err
}

// takeStored answers the writes stored since the last call.
func (c *counting) takeStored() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.stored
	c.stored = 0
	return n
}

func (c *counting) note(verb string) {
	c.mu.Lock()
	c.calls = append(c.calls, verb)
	c.mu.Unlock()
}

func (c *counting) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	calls := c.calls
	c.calls = nil
	return calls
}

func (c *counting) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.note("get")
	return c.Client.Get(ctx, key, obj, opts...)
}

func (c *counting) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	c.note("list")
	return c.Client.List(ctx, list, opts...)
}

func (c *counting) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.note("create")
	return c.wrote(c.Client.Create(ctx, obj, opts...))
}

func (c *counting) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.note("update")
	return c.wrote(c.Client.Update(ctx, obj, opts...))
}

func (c *counting) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	c.note("patch")
	return c.wrote(c.Client.Patch(ctx, obj, patch, opts...))
}

func (c *counting) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	c.note("delete")
	return c.wrote(c.Client.Delete(ctx, obj, opts...))
}

func calls(t *testing.T, c *counting, want ...string) {
	t.Helper()
	if got := c.take(); !slices.Equal(got, want) {
		t.Fatalf("API calls %v, want %v", got, want)
	}
}

func TestEachOperationIsOneCallWhenItWins(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	c := &counting{Client: env.Client}
	l := locks.New(c, nil)

	a, err := l.Acquire(ctx, ns, "one-call", "a", 30, 1)
	if err != nil || !a.Acquired || a.Already {
		t.Fatalf("acquire: %+v %v", a, err)
	}
	// The create, then the owner check at its version: the owner could
	// hold a higher slot, taken with a larger limit.
	calls(t, c, "create", "list")

	held, err := l.Acquire(ctx, ns, "one-call", "b", 30, 1)
	if err != nil || held.Acquired || held.Reason != locks.ReasonHeld || len(held.Holders) != 1 || held.Holders[0].Owner != "a" {
		t.Fatalf("acquire of a held lock: %+v %v", held, err)
	}
	calls(t, c, "create", "list")

	again, err := l.Acquire(ctx, ns, "one-call", "a", 30, 1)
	if err != nil || !again.Already || again.Token != a.Token {
		t.Fatalf("acquire by the holder: %+v %v", again, err)
	}
	calls(t, c, "create", "list")
	if n := c.takeStored(); n != 1 {
		t.Fatalf("three acquires, one of them won, stored %d writes, want 1", n)
	}

	rn, err := l.Renew(ctx, ns, "one-call", 0, a.Token, "a", 30)
	if err != nil || !rn.Renewed || rn.Token <= a.Token {
		t.Fatalf("renew: %+v %v", rn, err)
	}
	calls(t, c, "patch")

	ok, err := l.Release(ctx, ns, "one-call", 0, rn.Token, "a")
	if err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	calls(t, c, "delete")

	// A client that has not seen the version reads it first.
	a, _ = l.Acquire(ctx, ns, "one-call", "a", 30, 1)
	c.take()
	fresh := locks.New(c, nil)
	if ok, err := fresh.Release(ctx, ns, "one-call", 0, a.Token, "a"); err != nil || !ok {
		t.Fatalf("release by a fresh client: %v %v", ok, err)
	}
	calls(t, c, "get", "delete")

	// A semaphore with room: the owner check before any write (an owner
	// holding a slot is answered it with no write), the preferred slot,
	// then the check that no acquire of the same owner won another.
	s, err := l.Acquire(ctx, ns, "one-call-sem", "a", 30, 4)
	if err != nil || !s.Acquired {
		t.Fatalf("semaphore acquire: %+v %v", s, err)
	}
	calls(t, c, "list", "create", "list")
}

// consistentReads is how many lists of permits kube-apiserver has served
// from its watch cache as consistent reads, which wait for the cache to
// catch up with etcd's newest revision.
func consistentReads(t *testing.T) float64 {
	t.Helper()
	raw, err := env.Clientset.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0 // no series before the first such read
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "apiserver_watch_cache_consistent_read_total{") || !strings.Contains(line, `resource="queenlocks"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// A semaphore acquire makes one consistent read, before it writes (an
// owner that holds a slot already is answered with no write). After the
// write, it checks that its owner holds one slot with a list at the
// version of its own write or later, not with a consistent read:
// kube-apiserver answers a consistent list only once its watch cache has
// caught up with etcd's newest revision, and when the newest write was to
// another kind (an Event, a Lease) that waits for etcd's next progress
// report, up to 100 ms.
func TestASemaphoreOwnerCheckWaitsOnlyForItsOwnWrite(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	l := locks.New(env.Client, nil)
	start := consistentReads(t)
	if _, err := l.Get(ctx, ns, "own-write"); err != nil {
		t.Fatal(err)
	}
	before := consistentReads(t)
	if before == start {
		t.Fatal("a get of a lock's holders was not counted as a consistent read")
	}
	a, err := l.Acquire(ctx, ns, "own-write", "a", 30, 3)
	if err != nil || !a.Acquired {
		t.Fatalf("acquire: %+v %v", a, err)
	}
	if after := consistentReads(t); after != before+1 {
		t.Fatalf("the acquire made %v consistent reads, want 1 (before its write)", after-before)
	}
}

// laggingCache is the real API server behind a watch cache that never
// catches up: a list at a version answers what kube-apiserver answers
// after holding it 3 s, a 504 (too large resource version).
type laggingCache struct{ *counting }

func (l laggingCache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	o := (&client.ListOptions{}).ApplyOptions(opts)
	if o.Raw != nil && o.Raw.ResourceVersionMatch == metav1.ResourceVersionMatchNotOlderThan {
		l.note("list at a version")
		return apierrors.NewTimeoutError("Too large resource version: 999999999, current: 1", 1)
	}
	return l.counting.List(ctx, list, opts...)
}

// When kube-apiserver's watch cache lags, the owner check falls back to a
// consistent list, which kube-apiserver can serve from etcd, rather than
// failing the acquire.
func TestASemaphoreOwnerCheckReadsConsistentlyWhenTheWatchCacheLags(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	c := &counting{Client: env.Client}
	a, err := locks.New(laggingCache{c}, nil).Acquire(ctx, ns, "lagging", "a", 30, 3)
	if err != nil || !a.Acquired {
		t.Fatalf("acquire: %+v %v", a, err)
	}
	calls(t, c, "list", "create", "list at a version", "list")
}

func TestStaleTokensOfTheSameOwnerAreCarriedThrough(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	l := locks.New(env.Client, nil)
	a, _ := l.Acquire(ctx, ns, "carry", "a", 30, 1)
	r1, err := l.Renew(ctx, ns, "carry", 0, a.Token, "a", 30)
	if err != nil || !r1.Renewed {
		t.Fatal(r1, err)
	}
	// The answer to r1 was lost: the caller renews with its old token.
	r2, err := l.Renew(ctx, ns, "carry", 0, a.Token, "a", 30)
	if err != nil || !r2.Renewed || r2.Token <= r1.Token {
		t.Fatalf("carried renew: %+v %v", r2, err)
	}
	// Another owner with that stale token loses, and so does the exact
	// stale token without an owner.
	if r, err := l.Renew(ctx, ns, "carry", 0, a.Token, "b", 30); err != nil || r.Renewed || r.Reason != locks.ReasonLost {
		t.Fatalf("stale token of another owner: %+v %v", r, err)
	}
	if r, err := l.Renew(ctx, ns, "carry", 0, r1.Token, "", 30); err != nil || r.Renewed {
		t.Fatalf("stale token without owner: %+v %v", r, err)
	}
	if ok, err := l.Release(ctx, ns, "carry", 0, a.Token, "b"); err != nil || ok {
		t.Fatalf("release by another owner: %v %v", ok, err)
	}
	if ok, err := l.Release(ctx, ns, "carry", 0, a.Token, "a"); err != nil || !ok {
		t.Fatalf("carried release: %v %v", ok, err)
	}
	if hs, _ := l.Get(ctx, ns, "carry"); len(hs) != 0 {
		t.Fatalf("holders after release: %+v", hs)
	}
}

func TestReleaseAfterExpiryAnswersLostAndFreesTheSlot(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	l := locks.New(env.Client, nil)
	a, err := l.Acquire(ctx, ns, "late", "a", 1, 1)
	if err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return time.Now().After(a.ExpiresAt), nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*locks.Client{l, locks.New(env.Client, nil)} {
		ok, err := c.Release(ctx, ns, "late", 0, a.Token, "a")
		if err != nil || ok {
			t.Fatalf("release after expiry: %v %v, want lost", ok, err)
		}
	}
}

// Many acquires of one owner at once, over and over: the owner ends up
// with exactly one slot, and every answer names it.
func TestOneOwnerRacingItselfGetsOneSlot(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	const rounds, racers, limit = 15, 8, 3
	for round := range rounds {
		lock := fmt.Sprintf("self-race-%d", round)
		// Other owners hold some slots in some rounds, so that the owner's
		// preferred slot is sometimes taken.
		for i := range round % limit {
			if a, err := locks.New(env.Client, nil).Acquire(ctx, ns, lock, fmt.Sprintf("other-%d", i), 30, limit); err != nil || !a.Acquired {
				t.Fatal(a, err)
			}
		}
		answers := make([]locks.Acquired, racers)
		errs := make([]error, racers)
		var wg sync.WaitGroup
		for i := range racers {
			// Separate clients, as separate route replicas or processes.
			l := locks.New(env.Client, nil)
			wg.Go(func() { answers[i], errs[i] = l.Acquire(ctx, ns, lock, "me", 30, limit) })
		}
		wg.Wait()
		var list locksv1alpha1.QueenLockList
		if err := env.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{permit.LockLabel: permit.LabelValue(lock)}); err != nil {
			t.Fatal(err)
		}
		var mine []int32
		for _, p := range list.Items {
			if p.Spec.Owner == "me" && p.DeletionTimestamp.IsZero() {
				mine = append(mine, p.Spec.Slot)
			}
		}
		if len(mine) != 1 {
			t.Fatalf("round %d: owner holds slots %v", round, mine)
		}
		for i, a := range answers {
			if errs[i] != nil {
				t.Fatalf("round %d: %v", round, errs[i])
			}
			if !a.Acquired || int32(a.Slot) != mine[0] {
				t.Fatalf("round %d: answer %+v, but the owner holds slot %d", round, a, mine[0])
			}
		}
	}
}

func TestQuotaIsAnAnswer(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	q := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "locks"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"count/queenlocks.locks.queen.dev": resource.MustParse("1")}},
	}
	if err := env.Client.Create(ctx, q); err != nil {
		t.Fatal(err)
	}
	// The quota controller is not running here: fill in the status as it
	// would, and the quota admission counts from there.
	q.Status = corev1.ResourceQuotaStatus{Hard: q.Spec.Hard, Used: corev1.ResourceList{"count/queenlocks.locks.queen.dev": resource.MustParse("0")}}
	if err := env.Client.Status().Update(ctx, q); err != nil {
		t.Fatal(err)
	}
	l := locks.New(env.Client, nil)
	if a, err := l.Acquire(ctx, ns, "q0", "a", 30, 1); err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	for _, limit := range []int{1, 3} {
		a, err := l.Acquire(ctx, ns, "q1", "a", 30, limit)
		if err != nil || a.Acquired || a.Reason != locks.ReasonQuota {
			t.Fatalf("acquire past the quota, limit %d: %+v %v", limit, a, err)
		}
	}
}

// A waiting acquire costs a try when it starts and one when its wait is
// over, and nothing in between while nothing changes.
func TestAWaiterMakesNoCallsWhileNothingChanges(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	if a, err := locks.New(env.Client, nil).Acquire(ctx, ns, "quiet", "a", 60, 1); err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	c := &counting{Client: env.Client}
	hub := waiters.NewHub(10, 0, nil)
	got, err := locks.New(c, nil).Acquire(ctx, ns, "quiet", "b", 60, 1, locks.WaitUpTo(1500*time.Millisecond, hub))
	if err != nil || got.Acquired || got.Reason != locks.ReasonHeld {
		t.Fatalf("answer %+v %v", got, err)
	}
	calls(t, c, "create", "list", "create", "list")
	if hub.Waiting() != 0 {
		t.Fatalf("%d still waiting", hub.Waiting())
	}
}

// A stale token is carried through only within the holding it came from:
// the same owner name holding the lock again later is another holding, and
// a process paused through the first must not be carried onto it.
func TestAStaleTokenOfAnEarlierHoldingIsLost(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	l := locks.New(env.Client, nil)
	first, _ := l.Acquire(ctx, ns, "again", "host-a", 60, 1)
	if ok, err := l.Release(ctx, ns, "again", 0, first.Token, "host-a"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	x, _ := l.Acquire(ctx, ns, "again", "x", 60, 1)
	if ok, err := l.Release(ctx, ns, "again", 0, x.Token, "x"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	second, _ := l.Acquire(ctx, ns, "again", "host-a", 60, 1)
	if !second.Acquired || second.Already {
		t.Fatal(second)
	}
	for _, tok := range []uint64{first.Token, 1} {
		if r, err := l.Renew(ctx, ns, "again", 0, tok, "host-a", 60); err != nil || r.Renewed {
			t.Fatalf("renew with token %d of an earlier holding: %+v %v", tok, r, err)
		}
		if ok, err := l.Release(ctx, ns, "again", 0, tok, "host-a"); err != nil || ok {
			t.Fatalf("release with token %d of an earlier holding: %v %v", tok, ok, err)
		}
	}
	if hs, _ := l.Get(ctx, ns, "again"); len(hs) != 1 || hs[0].Token != second.Token {
		t.Fatalf("the second holding was touched: %+v", hs)
	}
}

// With the manager's cache, a free lock is one create and no read: the
// cache tells that the lock has no slot above 0 that its owner could hold.
// Once it has one, the limit-1 acquire reads the lock's permits and keeps
// the owner to the slot it holds.
func TestAFreeLockIsOneCreateWithTheManagersCache(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	c := &counting{Client: env.Client}
	cache := env.Manager.GetCache()
	l := locks.New(c, nil, locks.WithVersions(locks.CachedVersions(cache)))

	a, err := l.Acquire(ctx, ns, "fast", "a", 30, 1)
	if err != nil || !a.Acquired || a.Already {
		t.Fatalf("acquire: %+v %v", a, err)
	}
	calls(t, c, "create")

	// The owner holds slot 1 of another lock, taken with limit 2 while
	// slot 0 was held by someone else.
	if _, err := l.Acquire(ctx, ns, "wide", "x", 30, 1); err != nil {
		t.Fatal(err)
	}
	high, err := l.Acquire(ctx, ns, "wide", "a", 30, 2)
	if err != nil || !high.Acquired || high.Slot != 1 {
		t.Fatalf("acquire of slot 1: %+v %v", high, err)
	}
	if ok, err := l.Release(ctx, ns, "wide", 0, mustToken(t, l, ns, "wide", 0), "x"); err != nil || !ok {
		t.Fatalf("releasing slot 0: %v %v", ok, err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		var list locksv1alpha1.QueenLockList
		return cache.List(ctx, &list, client.InNamespace(ns)) == nil && slices.ContainsFunc(list.Items, func(p locksv1alpha1.QueenLock) bool {
			return p.Spec.Lock == "wide" && p.Spec.Slot == 1
		}), nil
	}); err != nil {
		t.Fatal("the manager's cache never saw slot 1")
	}
	c.take()
	again, err := l.Acquire(ctx, ns, "wide", "a", 30, 1)
	if err != nil || !again.Already || again.Slot != 1 || again.Token != high.Token {
		t.Fatalf("a limit-1 acquire by the owner of slot 1: %+v %v", again, err)
	}
	calls(t, c, "create", "list", "delete")
}

func mustToken(t *testing.T, l *locks.Client, ns, lock string, slot int) uint64 {
	t.Helper()
	hs, err := l.Get(context.Background(), ns, lock)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if h.Slot == slot {
			return h.Token
		}
	}
	t.Fatalf("slot %d of %s is not held", slot, lock)
	return 0
}
