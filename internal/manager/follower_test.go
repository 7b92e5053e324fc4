package manager_test

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// A replica that is not the leader still lets a deleted permit go: a
// foreground delete must not wait for a leader while the leader is dead or
// cut off. Here another replica holds the leader Lease for an hour, so this
// manager never leads.
func TestAFollowerFinishesDeletes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	const leNS = "default"
	env, err := controlplane.Start(controlplane.Options{
		LeaderElectionNamespace: leNS,
		Configure: func(mgr ctrl.Manager) error {
			c, err := client.New(mgr.GetConfig(), client.Options{})
			if err != nil {
				return err
			}
			now := metav1.NewMicroTime(time.Now())
			return c.Create(context.Background(), &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Namespace: leNS, Name: "queen-locks-expiry.locks.queen.dev"},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("another-replica"),
					LeaseDurationSeconds: ptr.To[int32](3600), AcquireTime: &now, RenewTime: &now},
			})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	ctx := context.Background()
	l := locks.New(env.Client, nil)
	a, err := l.Acquire(ctx, "default", "follower", "a", 600, 1)
	if err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	p := &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: permit.Name("follower", 0)}}
	if err := env.Client.Delete(ctx, p, client.PropagationPolicy(metav1.DeletePropagationForeground)); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := l.Acquire(ctx, "default", "follower", "b", 600, 1)
		return got.Acquired && !got.Already, err
	})
	if err != nil {
		t.Fatalf("the foreground-deleted permit kept the lock taken on a manager that does not lead: %v", err)
	}
	select {
	case <-env.Manager.Elected():
		t.Fatal("the manager was elected: the test did not test a follower")
	default:
	}
}
