package controllers_test

import (
	"context"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/controllers"
	"github.com/queen-locks/queen-locks/permit"
)

func namespace(t *testing.T) string {
	t.Helper()
	return env.Namespace(t, "exp")
}

func create(t *testing.T, ns, lock string, ttl int64) *locksv1alpha1.QueenLock {
	t.Helper()
	p := &locksv1alpha1.QueenLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: permit.Name(lock, 0)},
		Spec:       locksv1alpha1.QueenLockSpec{Lock: lock, Limit: 1, Owner: "a", TTLSeconds: ttl},
	}
	if err := env.Client.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	return p
}

func exists(t *testing.T, p *locksv1alpha1.QueenLock) bool {
	t.Helper()
	err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(p), &locksv1alpha1.QueenLock{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// staleReader answers one fixed copy of a permit, as a cache that is behind would.
type staleReader struct {
	client.Client
	snapshot *locksv1alpha1.QueenLock
}

func (s staleReader) Get(_ context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	s.snapshot.DeepCopyInto(obj.(*locksv1alpha1.QueenLock))
	return nil
}

func TestReconcileDeletesAtExpiryPlusGraceAndNotBefore(t *testing.T) {
	ctx := context.Background()
	p := create(t, namespace(t), "report", 3600)
	grace := time.Second
	clk := clocktesting.NewFakePassiveClock(p.Spec.ExpireTime.Add(grace - time.Millisecond))
	r := &controllers.Expiry{Client: env.Client, Clock: clk, Grace: grace}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(p)}

	res, err := r.Reconcile(ctx, req)
	if err != nil || res.RequeueAfter != time.Millisecond {
		t.Fatalf("just before the deadline: %+v, %v; want a requeue after 1ms", res, err)
	}
	if !exists(t, p) {
		t.Fatal("deleted before its expireTime plus grace")
	}
	clk.SetTime(p.Spec.ExpireTime.Add(grace))
	if res, err := r.Reconcile(ctx, req); err != nil || res.RequeueAfter != 0 {
		t.Fatalf("at the deadline: %+v, %v", res, err)
	}
	if exists(t, p) {
		t.Fatal("not deleted at its expireTime plus grace")
	}
	// Gone already: nothing to do, no error.
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
}

func TestRenewThatLandsFirstKeepsThePermit(t *testing.T) {
	ctx := context.Background()
	p := create(t, namespace(t), "renewed", 3600)
	stale := p.DeepCopy()
	if err := env.Client.Update(ctx, p); err != nil { // the renew
		t.Fatal(err)
	}
	clk := clocktesting.NewFakePassiveClock(stale.Spec.ExpireTime.Add(time.Hour))
	r := &controllers.Expiry{Client: staleReader{env.Client, stale}, Clock: clk, Grace: time.Second}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(p)}); err != nil {
		t.Fatal(err)
	}
	got := &locksv1alpha1.QueenLock{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil || got.ResourceVersion != p.ResourceVersion {
		t.Fatalf("the renewed permit was deleted or written by the controller: %v (rv %s, want %s)", err, got.ResourceVersion, p.ResourceVersion)
	}
}

func TestRunningControllerExpiresPermits(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	p := create(t, ns, "short", 1)
	kept := create(t, ns, "long", 3600)
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return !exists(t, p), nil
	})
	if err != nil {
		t.Fatalf("the controller did not delete the expired permit: %v", err)
	}
	if now := time.Now(); now.Before(p.Spec.ExpireTime.Time) {
		t.Fatalf("deleted at %v, before its expireTime %v", now, p.Spec.ExpireTime)
	}
	if !exists(t, kept) {
		t.Fatal("the controller deleted a held permit")
	}
	// It says so with an event on the permit.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var evs eventsv1.EventList
		if err := env.Client.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == "Expired" && e.Regarding.Name == p.Name {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no Expired event for %s: %v", p.Name, err)
	}
}
