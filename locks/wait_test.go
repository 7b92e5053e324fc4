package locks_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/locks/waiters"
	"github.com/queen-locks/queen-locks/permit"
)

// goneDuringCreate is the real API server, with a caller that goes away
// while its create is in flight: the create lands, then the caller's
// context ends before the answer comes back.
type goneDuringCreate struct {
	client.Client
	leave context.CancelFunc
}

func (g *goneDuringCreate) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	err := g.Client.Create(context.WithoutCancel(ctx), obj, opts...)
	g.leave()
	if ctx.Err() != nil {
		return ctx.Err() // the answer never reached a caller whose context ended
	}
	return err
}

// noRoom is a Waker with no room for another waiter, as at the cap.
type noRoom struct{}

func (noRoom) Wait(string, string, string, int) (locks.Waiter, bool) { return nil, false }

// At the waiter cap a waiting acquire tries once; when its caller goes away
// during that try's create, what the create won is given back, not left
// held until its TTL.
func TestAWaitingAcquireAtTheCapGivesBackWhatItsGoneCallerWon(t *testing.T) {
	ns := namespace(t)
	ctx, cancel := context.WithCancel(context.Background())
	l := locks.New(&goneDuringCreate{Client: env.Client, leave: cancel}, nil)
	_, err := l.Acquire(ctx, ns, "capped", "w", 600, 1, locks.WaitUpTo(10*time.Second, noRoom{}))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire for a caller that went away: %v, want context.Canceled", err)
	}
	hs, err := locks.New(env.Client, nil).Get(context.Background(), ns, "capped")
	if err != nil || len(hs) != 0 {
		t.Fatalf("holders %+v %v: what the gone caller's create won is still held", hs, err)
	}
}

// permitsOf is a hub's lister that reads the API server itself: a cache
// that is never stale.
func permitsOf(ns string) waiters.Lister {
	return func(_, lock string) []locksv1alpha1.QueenLock {
		var list locksv1alpha1.QueenLockList
		if err := env.Client.List(context.Background(), &list, client.InNamespace(ns), client.MatchingLabels{permit.LockLabel: permit.LabelValue(lock)}); err != nil {
			return nil
		}
		return list.Items
	}
}

// When the waker's cache shows every slot held by others, a waiting
// acquire sends no first try: only the try at the end of its wait.
func TestAWaiterTheCacheShowsHeldSendsNoFirstTry(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	for _, owner := range []string{"a", "b"} {
		if got, err := locks.New(env.Client, nil).Acquire(ctx, ns, "full", owner, 60, 2); err != nil || !got.Acquired {
			t.Fatal(got, err)
		}
	}
	c := &counting{Client: env.Client}
	hub := waiters.NewHub(10, 0, permitsOf(ns))
	got, err := locks.New(c, nil).Acquire(ctx, ns, "full", "c", 60, 2, locks.WaitUpTo(time.Second, hub))
	if err != nil || got.Acquired || got.Reason != locks.ReasonHeld || len(got.Holders) != 2 {
		t.Fatalf("answer %+v %v, want held by a and b", got, err)
	}
	calls(t, c, "list") // the last try: the list shows every slot held, so nothing is written
}

// A waiter that skipped its first try is woken by the slot that frees, and
// takes it.
func TestAWaiterThatSkippedItsTryTakesTheSlotThatFrees(t *testing.T) {
	ns := namespace(t)
	l := locks.New(env.Client, nil)
	held := holdEvery(t, l, ns, "frees", "a", "b")
	c := &counting{Client: env.Client}
	hub := waiters.NewHub(10, 0, permitsOf(ns))
	answer := waitInBackground(t, c, hub, ns, "frees", "c", 2)
	awaitAsleep(t, hub, 1)
	calls(t, c) // asleep without a call
	freeSlot(t, l, hub, ns, "frees", held[1], "b")
	got := <-answer
	if !got.Acquired || got.Slot != held[1].Slot {
		t.Fatalf("answer %+v, want slot %d", got, held[1].Slot)
	}
	calls(t, c, "list", "create", "list")
}

// holdEvery acquires one slot of lock, a semaphore of len(owners), for each
// owner.
func holdEvery(t *testing.T, l *locks.Client, ns, lock string, owners ...string) []locks.Acquired {
	t.Helper()
	var held []locks.Acquired
	for _, owner := range owners {
		got, err := l.Acquire(context.Background(), ns, lock, owner, 60, len(owners))
		if err != nil || !got.Acquired {
			t.Fatal(got, err)
		}
		held = append(held, got)
	}
	return held
}

// waitInBackground starts a waiting acquire of lock, a semaphore of limit,
// for owner through c, woken by hub; its answer comes on the channel.
func waitInBackground(t *testing.T, c client.Client, hub *waiters.Hub, ns, lock, owner string, limit int) <-chan locks.Acquired {
	t.Helper()
	answer := make(chan locks.Acquired, 1)
	go func() {
		got, err := locks.New(c, nil).Acquire(context.Background(), ns, lock, owner, 60, limit, locks.WaitUpTo(5*time.Minute, hub))
		if err != nil {
			t.Error(err)
		}
		answer <- got
	}()
	return answer
}

// freeSlot releases h as owner and tells hub its permit is gone, as the
// manager's watch of permits would.
func freeSlot(t *testing.T, l *locks.Client, hub *waiters.Hub, ns, lock string, h locks.Acquired, owner string) {
	t.Helper()
	var p locksv1alpha1.QueenLock
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: permit.Name(lock, h.Slot)}, &p); err != nil {
		t.Fatal(err)
	}
	if ok, err := l.Release(context.Background(), ns, lock, h.Slot, h.Token, owner); err != nil || !ok {
		t.Fatal(ok, err)
	}
	hub.Gone(&p)
}

// heldCreate is the real API server, with creates held at a gate until the
// test opens it: a woken waiter whose try is in flight.
type heldCreate struct {
	client.Client
	entered chan struct{}
	open    chan struct{}
}

func (h *heldCreate) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	h.entered <- struct{}{}
	<-h.open
	return h.Client.Create(ctx, obj, opts...)
}

// A newcomer that finds a slot free in the cache, while a waiter woken for
// that slot is trying it, leaves it to that waiter: it sleeps without a
// call, and the next slot to free wakes it.
func TestANewcomerLeavesAFreedSlotToTheWaiterWokenForIt(t *testing.T) {
	ns := namespace(t)
	l := locks.New(env.Client, nil)
	held := holdEvery(t, l, ns, "spoken", "a", "b")
	hub := waiters.NewHub(10, 0, permitsOf(ns))
	gate := &heldCreate{Client: env.Client, entered: make(chan struct{}, 4), open: make(chan struct{})}
	woken := waitInBackground(t, gate, hub, ns, "spoken", "c", 2)
	awaitAsleep(t, hub, 1)
	freeSlot(t, l, hub, ns, "spoken", held[1], "b")
	<-gate.entered // the woken waiter's create is in flight

	c := &counting{Client: env.Client}
	later := waitInBackground(t, c, hub, ns, "spoken", "d", 2)
	awaitAsleep(t, hub, 1) // the newcomer, while the woken waiter tries
	calls(t, c)
	close(gate.open)
	if got := <-woken; !got.Acquired || got.Slot != held[1].Slot {
		t.Fatalf("the woken waiter's answer %+v, want slot %d", got, held[1].Slot)
	}
	awaitAsleep(t, hub, 1)
	calls(t, c) // still asleep: the slot it saw free was taken by the waiter it was left to

	freeSlot(t, l, hub, ns, "spoken", held[0], "a")
	if got := <-later; !got.Acquired || got.Slot != held[0].Slot {
		t.Fatalf("the newcomer's answer %+v, want slot %d", got, held[0].Slot)
	}
	calls(t, c, "list", "create", "list")
}

// A retry of an acquire that won where the waker's cache has not seen it
// yet (on another replica, a moment ago) sleeps on the stale cache, and the
// write of its own permit reaching the cache wakes it to answer already,
// long before its wait is over.
func TestARetryTheCacheHasNotSeenAnswersAlreadyWhenItArrives(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := namespace(t)
	won, err := locks.New(env.Client, nil).Acquire(ctx, ns, "retry", "b", 60, 1)
	if err != nil || !won.Acquired {
		t.Fatal(won, err)
	}
	var mine locksv1alpha1.QueenLock
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: permit.Name("retry", 0)}, &mine); err != nil {
		t.Fatal(err)
	}
	stale := *mine.DeepCopy()
	stale.Spec.Owner = "a" // the holder before b, as the cache still has it
	hub := waiters.NewHub(10, 0, func(string, string) []locksv1alpha1.QueenLock { return []locksv1alpha1.QueenLock{stale} })
	answer := make(chan locks.Acquired, 1)
	go func() {
		got, err := locks.New(env.Client, nil).Acquire(ctx, ns, "retry", "b", 60, 1, locks.WaitUpTo(5*time.Minute, hub))
		if err != nil {
			t.Error(err)
		}
		answer <- got
	}()
	awaitAsleep(t, hub, 1)
	hub.Seen(&mine)
	got := <-answer
	if !got.Acquired || !got.Already || got.Token != won.Token {
		t.Fatalf("answer %+v, want already, token %d", got, won.Token)
	}
}

func awaitAsleep(t *testing.T, hub *waiters.Hub, n int) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return hub.Asleep() == n, nil
	}); err != nil {
		t.Fatalf("%d waiters asleep, want %d", hub.Asleep(), n)
	}
}
