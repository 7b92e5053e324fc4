package locks_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// rivalFirst is the real API server, where another owner's acquire of a
// free slot lands between this acquire's list and its create of that slot:
// the race that leaves a plain acquire of a semaphore with expired slots
// only, made on purpose.
type rivalFirst struct {
	client.Client
	rival func(ctx context.Context, p *locksv1alpha1.QueenLock) error
}

func (r *rivalFirst) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if p, ok := obj.(*locksv1alpha1.QueenLock); ok && r.rival != nil {
		rival := r.rival
		r.rival = nil
		if err := rival(ctx, p); err != nil {
			return err
		}
	}
	return r.Client.Create(ctx, obj, opts...)
}

// A plain acquire of a semaphore whose free slot is taken from under it
// does not take an expired slot over while others wait in the line: the
// expired slot is the line's, as when no slot was free to begin with.
func TestAPlainAcquireThatLostTheFreeSlotDoesNotPassTheLine(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	const lock = "sem"
	l := locks.New(env.Client, nil, locks.WithGrace(env.Grace))
	old, err := l.Acquire(ctx, ns, lock, "old", 60, 2)
	if err != nil || !old.Acquired {
		t.Fatal(old, err)
	}
	w := &locksv1alpha1.QueenLockWaiter{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "sem-", Labels: map[string]string{permit.LockLabel: permit.LabelValue(lock)}},
		Spec:       locksv1alpha1.QueenLockWaiterSpec{Lock: lock, Owner: "waiting", Limit: 2, TTLSeconds: 300},
	}
	if err := env.Client.Create(ctx, w); err != nil {
		t.Fatal(err)
	}
	// The plain acquire judges the old holding over (its clock is past the
	// lifetime and the grace); the expiry controller, on the real clock,
	// has not deleted it, so the slot is expired, not free. It writes as
	// the manager does (the route), stamping its own times.
	later := clocktesting.NewFakePassiveClock(old.ExpiresAt.Add(env.Grace + time.Minute))
	rc := &rivalFirst{Client: env.Client}
	rc.rival = func(ctx context.Context, p *locksv1alpha1.QueenLock) error {
		r, err := locks.New(env.Client, nil).Acquire(ctx, ns, lock, "rival", 600, 2)
		if err != nil || !r.Acquired || r.Slot != int(p.Spec.Slot) {
			t.Errorf("the rival's acquire of slot %d: %+v %v", p.Spec.Slot, r, err)
		}
		return nil
	}
	got, err := locks.New(rc, later, locks.WithGrace(env.Grace), locks.AsManager()).Acquire(ctx, ns, lock, "plain", 600, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got.Acquired || got.Reason != locks.ReasonHeld {
		t.Fatalf("answer %+v: a plain acquire passed a waiter to take the expired slot", got)
	}
	var p locksv1alpha1.QueenLock
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: permit.Name(lock, old.Slot)}, &p); err != nil || p.Spec.Owner != "old" {
		t.Fatalf("the expired slot: %+v %v, want old's permit still there for the line", p.Spec, err)
	}
}
