package webhook_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// fencedLocks runs lock operations as the manager does: with the
// manager's identity (the admin, in these tests), raising the fence of
// the slot's bound objects before an acquire answers.
func fencedLocks(t *testing.T) *locks.Client {
	t.Helper()
	fence, err := manager.NewFence(env.Config, nil)
	if err != nil {
		t.Fatal(err)
	}
	return locks.New(env.Client, nil, locks.WithGrace(env.Grace), locks.WithFence(fence))
}

// acquired fails t unless the acquire it is given won.
func acquired(t *testing.T) func(locks.Acquired, error) locks.Acquired {
	t.Helper()
	return func(a locks.Acquired, err error) locks.Acquired {
		t.Helper()
		if err != nil || !a.Acquired {
			t.Fatalf("acquire: %+v, %v", a, err)
		}
		return a
	}
}

func guardOf(lock string, slot int, token uint64) string {
	return permit.Guard{Lock: lock, Slot: slot, Token: token}.String()
}

// heldWrite is a replaced holder's write of ConfigMap ns/name under guard,
// and the operation kube-apiserver sends the webhooks for it.
// It is sent by a namespace user (the administrator may override the
// guard).
type heldWrite struct {
	op    string
	write func(ctx context.Context, c client.Client, ns, name, guard string) error
}

var heldWrites = map[string]heldWrite{
	"delete": {"DELETE", func(ctx context.Context, c client.Client, ns, name, _ string) error {
		return c.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
	}},
}

func init() {
	for _, path := range []string{"update", "merge patch", "JSON patch", "server-side apply", "replace"} {
		w := writePaths[path]
		heldWrites[path] = heldWrite{"UPDATE", func(ctx context.Context, c client.Client, ns, name, guard string) error {
			return w(ctx, c, ns, name, guard, "stale")
		}}
	}
}

// TestAHeldWriteOfAReplacedHolderIsNeverStored holds a replaced holder's
// write of a bound object inside kube-apiserver, after the guard admitted
// it under the holder's then current token, until the next holder's
// acquire has been answered; whichever way the slot changed hands, the
// write is then refused and nothing of it is stored, and the next
// holder's writes land.
func TestAHeldWriteOfAReplacedHolderIsNeverStored(t *testing.T) {
	ns := holdingNamespace(t)
	lc := fencedLocks(t)
	grant(t, ns, "dev", "", []string{"configmaps"}, []string{"*"})
	dev := asUser(t, "dev")
	nexts := map[string]func(t *testing.T, lock string, a locks.Acquired) locks.Acquired{
		"after a release": func(t *testing.T, lock string, a locks.Acquired) locks.Acquired {
			t.Helper()
			if ok, err := lc.Release(context.Background(), ns, lock, 0, a.Token, "a"); err != nil || !ok {
				t.Fatalf("release: %v %v", ok, err)
			}
			return acquired(t)(lc.Acquire(context.Background(), ns, lock, "b", 600, 1))
		},
		"after a manual delete": func(t *testing.T, lock string, a locks.Acquired) locks.Acquired {
			t.Helper()
			p := &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: permit.Name(lock, 0)}}
			if err := env.Client.Delete(context.Background(), p); err != nil {
				t.Fatal(err)
			}
			return acquired(t)(lc.Acquire(context.Background(), ns, lock, "b", 600, 1))
		},
		"after an expiry": func(t *testing.T, lock string, _ locks.Acquired) locks.Acquired {
			t.Helper()
			var b locks.Acquired
			err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				var err error
				b, err = lc.Acquire(ctx, ns, lock, "b", 600, 1)
				return b.Acquired, err
			})
			if err != nil {
				t.Fatalf("the takeover never won: %v", err)
			}
			return b
		},
	}
	i := 0
	for next, handOver := range nexts {
		for path, w := range heldWrites {
			i++
			lock, name := fmt.Sprintf("job-%d", i), fmt.Sprintf("report-%d", i)
			t.Run(next+"/"+path, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				ttl := int64(600)
				if next == "after an expiry" {
					ttl = 3 // the held write is checked at once, well inside it
				}
				a := acquired(t)(lc.Acquire(ctx, ns, lock, "a", ttl, 1))
				guardA := guardOf(lock, 0, a.Token)
				if err := dev.Create(ctx, guarded(ns, name, guardA, "by A")); err != nil {
					t.Fatal(err)
				}
				if path == "delete" {
					if err := markDeletable(ctx, dev, ns, name, guardA); err != nil {
						t.Fatal(err)
					}
				}
				x := theHolds.arm("configmaps", ns, name, w.op)
				errs := make(chan error, 1)
				go func() { errs <- w.write(ctx, dev, ns, name, guardA) }()
				awaitHeld(t, x, errs)

				b := handOver(t, lock, a)
				close(x.release)
				err := <-errs
				refusedWith(t, err)
				cm := &corev1.ConfigMap{}
				if gerr := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cm); gerr != nil {
					t.Fatalf("the object is gone (%v); the held write's error was %v", gerr, err)
				}
				if cm.Data["report"] != "by A" {
					t.Fatalf("stored %v, want A's content: the held write landed (its error: %v)", cm.Data, err)
				}
				if got, want := cm.Annotations[permit.FenceAnnotation], guardOf(lock, 0, b.Token); got != want {
					t.Fatalf("record %q, want the next holding's first token %q", got, want)
				}
				if _, ok := cm.Annotations[permit.DeletableAnnotation]; ok {
					t.Fatal("the deletable mark outlived the raise")
				}
				if err := write(ctx, ns, name, guardOf(lock, 0, b.Token), "by B"); err != nil {
					t.Fatalf("the next holder's write was refused: %v", err)
				}
			})
		}
	}
}

// TestTheRaiseIsIdempotentAndOneWritePerObject: a raise writes one new
// version of each bound object whose record is below the floor and none of
// the others, so a repeat acquire of the holder (already) stores nothing
// more, and a lock with no bound objects is raised by no write at all.
func TestTheRaiseIsIdempotentAndOneWritePerObject(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	lc := fencedLocks(t)
	fence, err := manager.NewFence(env.Config, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := acquired(t)(lc.Acquire(ctx, ns, "job", "a", 600, 1))
	for i := range 3 {
		if err := env.Client.Create(ctx, guarded(ns, fmt.Sprintf("cm-%d", i), guardOf("job", 0, a.Token), "x")); err != nil {
			t.Fatal(err)
		}
	}
	objs, err := fence.Bound(ctx, ns, "job", 0)
	if err != nil || len(objs) != 3 {
		t.Fatalf("bound: %v %v, want 3", objs, err)
	}
	versions := func() []string {
		var out []string
		for i := range 3 {
			out = append(out, stored(t, ns, fmt.Sprintf("cm-%d", i)).ResourceVersion)
		}
		return out
	}
	unchanged := func(before []string, what string) {
		t.Helper()
		if after := versions(); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("%s stored new versions: %v, then %v", what, before, after)
		}
	}
	before := versions()
	if _, err := fence.Raise(ctx, ns, "job", 0, a.Token); err != nil {
		t.Fatal(err)
	}
	unchanged(before, "raising to the holder's own token")
	if n, err := fence.Raise(ctx, ns, "job", 0, a.Token+1000); err != nil || n != 3 {
		t.Fatalf("raise took %d (%v), want 3", n, err)
	}
	raised := versions()
	for i := range raised {
		if raised[i] == before[i] {
			t.Fatalf("cm-%d was not written by the raise: %v, then %v", i, before, raised)
		}
	}
	if _, err := fence.Raise(ctx, ns, "job", 0, a.Token+10); err != nil {
		t.Fatal(err)
	}
	unchanged(raised, "a lower raise")
	if _, err := fence.Raise(ctx, ns, "job", 0, a.Token+1000); err != nil {
		t.Fatal(err)
	}
	unchanged(raised, "the same raise again")
	if got := stored(t, ns, "cm-0").Annotations[permit.FenceAnnotation]; got != guardOf("job", 0, a.Token+1000) {
		t.Fatalf("record %q", got)
	}
	if n, err := fence.Raise(ctx, ns, "nothing-bound", 0, a.Token); err != nil || n != 0 {
		t.Fatalf("raise of a slot with no objects took %d (%v)", n, err)
	}
}

// TestOnlyTheManagerRaises: a raise annotation from anyone else is
// refused, and a write cannot drop or change the slot label.
func TestOnlyTheManagerRaises(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	lc := fencedLocks(t)
	a := acquired(t)(lc.Acquire(ctx, ns, "job", "a", 600, 1))
	grant(t, ns, "dev", "", []string{"configmaps"}, []string{"*"})
	dev := asUser(t, "dev")
	if err := dev.Create(ctx, guarded(ns, "cm", guardOf("job", 0, a.Token), "x")); err != nil {
		t.Fatal(err)
	}
	cm := stored(t, ns, "cm")
	if cm.Labels[permit.SlotLabel] != permit.SlotLabelValue("job", 0) {
		t.Fatalf("labels %v: the binding write did not name the slot", cm.Labels)
	}
	cm.Annotations[permit.RaiseAnnotation] = guardOf("job", 0, a.Token+1000)
	refusedWith(t, dev.Update(ctx, cm), "only the queen-locks manager raises")
	cm = stored(t, ns, "cm")
	cm.Labels[permit.SlotLabel] = "s-other"
	cm.Annotations[permit.GuardAnnotation] = guardOf("job", 0, a.Token)
	if err := dev.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, ns, "cm").Labels[permit.SlotLabel]; got != permit.SlotLabelValue("job", 0) {
		t.Fatalf("slot label %q after a write that changed it", got)
	}
}

// TestTheObjectsBoundToASlotAreCapped: the binding past the cap is refused,
// naming the lock and the cap.
func TestTheObjectsBoundToASlotAreCapped(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	lc := fencedLocks(t)
	a := acquired(t)(lc.Acquire(ctx, ns, "job", "a", 600, 1))
	g := guardOf("job", 0, a.Token)
	for i := range permit.MaxBoundPerSlot {
		if err := env.Client.Create(ctx, guarded(ns, fmt.Sprintf("cm-%d", i), g, "x")); err != nil {
			t.Fatal(err)
		}
	}
	refusedWith(t, env.Client.Create(ctx, guarded(ns, "one-more", g, "x")), `lock "job" slot 0 already has 32 objects bound`)
	// The objects already bound still take their holder's writes.
	if err := write(ctx, ns, "cm-0", g, "y"); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "one-more"}, &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the refused binding was stored: %v", err)
	}
}

// TestAnAcquireOutsideTheManagerRaisesBeforeItIsAdmitted: an acquire that
// reaches kube-apiserver without the manager (the handles' and the CLI's
// direct transport, a raw create of a permit) is raised by the permit
// webhook before it is admitted, so before its writer learns it won: a
// replaced holder's held write is refused all the same.
func TestAnAcquireOutsideTheManagerRaisesBeforeItIsAdmitted(t *testing.T) {
	ns := holdingNamespace(t)
	grant(t, ns, "dev", "", []string{"configmaps"}, []string{"*"})
	grant(t, ns, "dev", "locks.queen.dev", []string{"queenlocks"}, []string{"*"})
	dev := asUser(t, "dev")
	direct := locks.New(dev, nil, locks.WithGrace(env.Grace)) // as handle's Kubernetes transport
	cases := []struct {
		name string
		ttl  int64
		path string
		next func(t *testing.T, lock string, a locks.Acquired) uint64
	}{
		{"direct transport after a release", 600, "merge patch", func(t *testing.T, lock string, a locks.Acquired) uint64 {
			t.Helper()
			if ok, err := direct.Release(context.Background(), ns, lock, 0, a.Token, "a"); err != nil || !ok {
				t.Fatalf("release: %v %v", ok, err)
			}
			return acquired(t)(direct.Acquire(context.Background(), ns, lock, "b", 600, 1)).Token
		}},
		{"direct transport takeover after an expiry", 3, "server-side apply", func(t *testing.T, lock string, _ locks.Acquired) uint64 {
			t.Helper()
			var b locks.Acquired
			err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				var err error
				b, err = direct.Acquire(ctx, ns, lock, "b", 600, 1)
				return b.Acquired, err
			})
			if err != nil {
				t.Fatalf("the takeover never won: %v", err)
			}
			return b.Token
		}},
		{"raw create after a manual delete", 600, "delete", func(t *testing.T, lock string, _ locks.Acquired) uint64 {
			t.Helper()
			ctx := context.Background()
			if err := dev.Delete(ctx, &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: permit.Name(lock, 0)}}); err != nil {
				t.Fatal(err)
			}
			p := newPermit(ns, lock, 0, 1, "b", 600)
			if err := dev.Create(ctx, p); err != nil {
				t.Fatal(err)
			}
			return token(t, p)
		}},
	}
	for i, c := range cases {
		lock, name := fmt.Sprintf("direct-%d", i), fmt.Sprintf("direct-report-%d", i)
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			a := acquired(t)(direct.Acquire(ctx, ns, lock, "a", c.ttl, 1))
			guardA := guardOf(lock, 0, a.Token)
			if err := dev.Create(ctx, guarded(ns, name, guardA, "by A")); err != nil {
				t.Fatal(err)
			}
			w := heldWrites[c.path]
			if c.path == "delete" {
				if err := markDeletable(ctx, dev, ns, name, guardA); err != nil {
					t.Fatal(err)
				}
			}
			x := theHolds.arm("configmaps", ns, name, w.op)
			errs := make(chan error, 1)
			go func() { errs <- w.write(ctx, dev, ns, name, guardA) }()
			awaitHeld(t, x, errs)
			b := c.next(t, lock, a)
			close(x.release)
			refusedWith(t, <-errs)
			cm := stored(t, ns, name)
			if cm.Data["report"] != "by A" {
				t.Fatalf("stored %v, want A's content", cm.Data)
			}
			if err := writePaths["update"](ctx, dev, ns, name, guardOf(lock, 0, b), "by B"); err != nil {
				t.Fatalf("the next holder's write was refused: %v", err)
			}
		})
	}
}

// TestTwoCreatesOfAFreeSlotLeaveTheWinnerItsObjects holds two raw creates
// of one free slot after the permit webhook raised the fence for each,
// the loser's raise coming after the winner's: the winner's token is still
// above both floors, and its writes land.
func TestTwoCreatesOfAFreeSlotLeaveTheWinnerItsObjects(t *testing.T) {
	ctx := context.Background()
	ns := holdingNamespace(t)
	grant(t, ns, "dev", "", []string{"configmaps"}, []string{"*"})
	grant(t, ns, "dev", "locks.queen.dev", []string{"queenlocks"}, []string{"*"})
	dev := asUser(t, "dev")
	direct := locks.New(dev, nil, locks.WithGrace(env.Grace))
	z := acquired(t)(direct.Acquire(ctx, ns, "job", "z", 600, 1))
	if err := dev.Create(ctx, guarded(ns, "report", guardOf("job", 0, z.Token), "by Z")); err != nil {
		t.Fatal(err)
	}
	if ok, err := direct.Release(ctx, ns, "job", 0, z.Token, "z"); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	first := theHolds.arm("queenlocks", ns, permit.Name("job", 0), "CREATE")
	second := theHolds.arm("queenlocks", ns, permit.Name("job", 0), "CREATE")
	winner, loser := newPermit(ns, "job", 0, 1, "a", 600), newPermit(ns, "job", 0, 1, "b", 600)
	errsW, errsL := make(chan error, 1), make(chan error, 1)
	go func() { errsW <- dev.Create(ctx, winner) }()
	awaitHeld(t, first, errsW)
	go func() { errsL <- dev.Create(ctx, loser) }()
	awaitHeld(t, second, errsL)
	rec, _, err := permit.ParseFence(stored(t, ns, "report").Annotations[permit.FenceAnnotation])
	if err != nil || rec.Token <= z.Token {
		t.Fatalf("record %+v (%v): both creates were admitted, and neither raised the fence above Z's token", rec, err)
	}
	close(first.release)
	if err := <-errsW; err != nil {
		t.Fatalf("the first create: %v", err)
	}
	close(second.release)
	if err := <-errsL; !apierrors.IsAlreadyExists(err) {
		t.Fatalf("the second create: %v, want AlreadyExists", err)
	}
	if tok := token(t, winner); tok <= rec.Token {
		t.Fatalf("the winner's token %d is not above the floor %d", tok, rec.Token)
	}
	if err := writePaths["update"](ctx, dev, ns, "report", guardOf("job", 0, token(t, winner)), "by the winner"); err != nil {
		t.Fatalf("the winner's write was refused: %v", err)
	}
	if err := writePaths["update"](ctx, dev, ns, "report", guardOf("job", 0, z.Token), "by Z"); err == nil {
		t.Fatal("the released holder's write landed")
	}
}
