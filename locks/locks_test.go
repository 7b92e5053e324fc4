package locks_test

import (
	"context"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
)

func namespace(t *testing.T) string {
	t.Helper()
	return env.Namespace(t, "locks")
}

// racer is the real API server with a crowd in front of it: just before each
// of our creates, another owner creates the same permit, and right after, it
// releases it. Every read sees a free slot; every create of ours loses.
type racer struct {
	client.Client
	creates int
}

func (r *racer) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	r.creates++
	theirs := obj.DeepCopyObject().(*locksv1alpha1.QueenLock)
	theirs.Spec.Owner = "crowd"
	if err := r.Client.Create(ctx, theirs); err != nil {
		return err
	}
	defer func() { _ = r.Client.Delete(ctx, theirs) }()
	return r.Client.Create(ctx, obj, opts...)
}

func TestAcquireAnswersContendedWhenFreeSlotsKeepBeingTaken(t *testing.T) {
	ns := namespace(t)
	r := &racer{Client: env.Client}
	got, err := locks.New(r, nil).Acquire(context.Background(), ns, "busy", "me", 30, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got.Acquired || got.Reason != locks.ReasonContended {
		t.Fatalf("answer %+v, want contended", got)
	}
	// Bounded: each try lists the permits, then attempts each free slot
	// once.
	if want := locks.DefaultTries * 2; r.creates != want {
		t.Fatalf("%d creates, want %d", r.creates, want)
	}
}
