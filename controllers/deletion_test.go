package controllers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// A foreground or orphan delete makes the API server add a finalizer and
// wait for the garbage collector. A released permit must not keep its name
// (and so its lock) taken: the controller lets it go, and the lock can be
// acquired again within seconds, with no garbage collector running.
func TestAPermitDeletedAnyWayIsGoneWithinSeconds(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	l := locks.New(env.Client, nil)
	for _, policy := range []metav1.DeletionPropagation{metav1.DeletePropagationForeground, metav1.DeletePropagationOrphan, metav1.DeletePropagationBackground} {
		t.Run(string(policy), func(t *testing.T) {
			lock := "cascade-" + strings.ToLower(string(policy))
			a, err := l.Acquire(ctx, ns, lock, "a", 600, 1)
			if err != nil || !a.Acquired {
				t.Fatal(a, err)
			}
			p := create(t, ns, lock+"-probe", 600) // a second permit, to delete the same way below
			for _, name := range []string{p.Name, permit.Name(lock, 0)} {
				obj := p.DeepCopy()
				obj.Name = name
				if err := env.Client.Delete(ctx, obj, client.PropagationPolicy(policy)); err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			var got locks.Acquired
			err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
				got, err = l.Acquire(ctx, ns, lock, "b", 600, 1)
				return got.Acquired, err
			})
			if err != nil {
				t.Fatalf("the lock stayed unacquirable after a %s delete: last answer %+v: %v", policy, got, err)
			}
			if got.Already || got.Owner != "b" {
				t.Fatalf("answer %+v", got)
			}
			if !waitGone(t, p) {
				t.Fatalf("the %s-deleted permit %s is still there", policy, p.Name)
			}
			t.Logf("%s: acquirable again after %v", policy, time.Since(start))
		})
	}
}

func waitGone(t *testing.T, p client.Object) bool {
	t.Helper()
	return wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return !exists(t, p.(*locksv1alpha1.QueenLock)), nil
	}) == nil
}
