package webhook_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// TestAnObjectBoundTheMomentBeforeAnAcquireIsRaised: an object bound by
// the holder just before it releases (a create, and an opt-in of an
// object that was not guarded) is raised by the very next acquire, with
// nothing awaited in between: the acquire reads the slot's QueenLockFence
// from etcd, where the guard recorded the object before admitting its
// binding, not from a cache that could still lag.
func TestAnObjectBoundTheMomentBeforeAnAcquireIsRaised(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	lc := fencedLocks(t)
	owner := "a"
	a := acquired(t)(lc.Acquire(ctx, ns, "job", owner, 600, 1))
	for round := range 10 {
		created, optedIn := fmt.Sprintf("created-%d", round), fmt.Sprintf("opted-in-%d", round)
		if err := env.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: optedIn}}); err != nil {
			t.Fatal(err)
		}
		g := guardOf("job", 0, a.Token)
		if err := env.Client.Create(ctx, guarded(ns, created, g, "x")); err != nil {
			t.Fatal(err)
		}
		cm := &corev1.ConfigMap{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: optedIn}, cm); err != nil {
			t.Fatal(err)
		}
		cm.Labels = map[string]string{permit.GuardedLabel: "true"}
		cm.Annotations = map[string]string{permit.GuardAnnotation: g}
		if err := env.Client.Update(ctx, cm); err != nil {
			t.Fatal(err)
		}
		if ok, err := lc.Release(ctx, ns, "job", 0, a.Token, owner); err != nil || !ok {
			t.Fatal(ok, err)
		}
		owner = fmt.Sprintf("owner-%d", round)
		a = acquired(t)(lc.Acquire(ctx, ns, "job", owner, 600, 1))
		for _, name := range []string{created, optedIn} {
			if got, want := stored(t, ns, name).Annotations[permit.FenceAnnotation], guardOf("job", 0, a.Token); got != want {
				t.Fatalf("round %d: %s's record is %q after the next acquire answered, want %q", round, name, got, want)
			}
		}
	}
}

// TestTheSlotsFenceIsKeptByTheGuard: the QueenLockFence of a slot names
// each bound object once; a dry run records nothing; a full slot drops
// entries whose objects are gone only once they are older than any write
// kube-apiserver may still hold (locks.StaleAfter), so a binding still on
// its way to storage is never dropped.
func TestTheSlotsFenceIsKeptByTheGuard(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	lc := fencedLocks(t)
	fence, err := manager.NewFence(env.Config, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := acquired(t)(lc.Acquire(ctx, ns, "job", "a", 600, 1))
	g := guardOf("job", 0, a.Token)

	dry := guarded(ns, "dry", g, "x")
	if err := env.Client.Create(ctx, dry, client.DryRunAll); err != nil {
		t.Fatal(err)
	}
	var fc locksv1alpha1.QueenLockFence
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: permit.Name("job", 0)}, &fc); err == nil {
		t.Fatalf("a dry run recorded %v", fc.Spec.Objects)
	}

	for i := range permit.MaxBoundPerSlot {
		if err := env.Client.Create(ctx, guarded(ns, fmt.Sprintf("cm-%d", i), g, "x")); err != nil {
			t.Fatal(err)
		}
	}
	// Writes of bound objects record nothing more.
	if err := write(ctx, ns, "cm-0", g, "y"); err != nil {
		t.Fatal(err)
	}
	objs, err := fence.Bound(ctx, ns, "job", 0)
	if err != nil || len(objs) != permit.MaxBoundPerSlot {
		t.Fatalf("bound: %d %v, want %d", len(objs), err, permit.MaxBoundPerSlot)
	}
	for _, name := range []string{"cm-1", "cm-2"} {
		if err := markDeletable(ctx, env.Client, ns, name, g); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	// Gone, but recorded too recently to tell from a binding still held.
	refusedWith(t, env.Client.Create(ctx, guarded(ns, "one-more", g, "x")), `lock "job" slot 0 already has 32 objects bound`)
	later := time.Now().Add(locks.StaleAfter + time.Minute)
	obj := locksv1alpha1.FencedObject{Version: "v1", Resource: "configmaps", Name: "later"}
	if err := fence.Enroll(ctx, ns, "job", 0, obj, true, later); err != nil {
		t.Fatalf("a slot whose gone objects are old enough to drop refused a binding: %v", err)
	}
	objs, err = fence.Bound(ctx, ns, "job", 0)
	if err != nil || len(objs) != permit.MaxBoundPerSlot-1 {
		t.Fatalf("bound after the drop: %d %v, want %d", len(objs), err, permit.MaxBoundPerSlot-1)
	}
	for _, o := range objs {
		if o.Name == "cm-1" || o.Name == "cm-2" {
			t.Fatalf("%s is gone but still recorded: %v", o.Name, objs)
		}
	}
}
