package locks_test

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// Two lock clients are two replicas: each remembers only its own answers.
// A renew answered by one and retried with the old token on the other is
// carried through; a release too; an earlier holding's token is not.
func TestTwoReplicasCarryAStaleTokenAlike(t *testing.T) {
	ctx := context.Background()
	tp := env.Production(t, controlplane.TopologyOptions{})
	ns := tp.LockNS
	r0, r1 := locks.New(env.Client, nil), locks.New(env.Client, nil)

	a, err := r0.Acquire(ctx, ns, "report", "w", 600, 1)
	if err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	first, err := r0.Renew(ctx, ns, "report", 0, a.Token, "w", 600) // its answer is "lost"
	if err != nil || !first.Renewed {
		t.Fatal(first, err)
	}
	retry, err := r1.Renew(ctx, ns, "report", 0, a.Token, "w", 600)
	if err != nil || !retry.Renewed || retry.Token <= first.Token {
		t.Fatalf("retry on the other replica: %+v %v, want renewed past token %d", retry, err, first.Token)
	}
	if ok, err := r1.Release(ctx, ns, "report", 0, first.Token, "w"); err != nil || !ok {
		t.Fatalf("release with a stale token of the holding on the other replica: %v %v", ok, err)
	}

	b, err := r1.Acquire(ctx, ns, "report", "w", 600, 1)
	if err != nil || !b.Acquired {
		t.Fatal(b, err)
	}
	if _, err := r1.Renew(ctx, ns, "report", 0, b.Token, "w", 600); err != nil {
		t.Fatal(err)
	}
	for i, r := range []*locks.Client{r0, r1} {
		got, err := r.Renew(ctx, ns, "report", 0, a.Token, "w", 600)
		if err != nil || got.Renewed || got.Reason != locks.ReasonLost {
			t.Fatalf("replica %d: a renew with the earlier holding's token: %+v %v, want lost", i, got, err)
		}
	}
}

// A pod of one namespace holding a lock in another over the Kubernetes API
// (the Go handle's direct transport, with the pod's own bound token)
// records its pod there, keeps the lock while it lives and loses it when it
// is deleted.
func TestAPodLocksInAnotherNamespaceOverTheAPI(t *testing.T) {
	ctx := context.Background()
	tp := env.Production(t, controlplane.TopologyOptions{})
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = env.PodToken(t, tp.Pod) // the API server's audience, as a pod's own token
	c, err := client.New(cfg, client.Options{Scheme: manager.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	l := locks.New(c, nil)
	a, err := l.Acquire(ctx, tp.LockNS, "nightly", "pod-run", 600, 1, locks.HolderPod(tp.PodNS, tp.Pod.Name, string(tp.Pod.UID)))
	if err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	// The namespace is filled in from the pod's token when left out.
	b, err := l.Acquire(ctx, tp.LockNS, "weekly", "pod-run", 600, 1, locks.HolderPod("", tp.Pod.Name, string(tp.Pod.UID)))
	if err != nil || !b.Acquired {
		t.Fatal(b, err)
	}
	for _, lock := range []string{"nightly", "weekly"} {
		p := &locksv1alpha1.QueenLock{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: tp.LockNS, Name: permit.Name(lock, 0)}, p); err != nil {
			t.Fatal(err)
		}
		if hp := p.Spec.HolderPod; hp == nil || hp.Namespace != tp.PodNS || hp.Name != tp.Pod.Name {
			t.Fatalf("%s: holderPod %+v, want pod %s/%s", lock, hp, tp.PodNS, tp.Pod.Name)
		}
	}
	// Still held a few seconds on: a follower looking for the pod in the
	// lock's namespace frees it within a second or two.
	time.Sleep(3 * time.Second)
	if h, err := l.Get(ctx, tp.LockNS, "nightly"); err != nil || len(h) != 1 || h[0].Token != a.Token {
		t.Fatalf("holders of a live pod's lock after 3 s: %+v %v", h, err)
	}
	if err := env.Client.Delete(ctx, tp.Pod); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 2*time.Second, true, func(ctx context.Context) (bool, error) {
		h, err := locks.New(env.Client, nil).Get(ctx, tp.LockNS, "nightly")
		return err == nil && len(h) == 0, nil
	})
	if err != nil {
		t.Fatal("the lock was not freed within 2 s of its pod's deletion")
	}
}
