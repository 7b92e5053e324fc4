package webhook_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/webhook"
)

// A review is the one request that makes the manager write something
// (the fence's raise), and where kube-apiserver presents no client
// certificate anyone can post one. A review that claims a live permit is
// an expired one, by its version, its times or both, is refused and
// raises nothing: the holder's objects keep taking its writes.
func TestAForgedTakeoverRaisesNoFence(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	lc := fencedLocks(t)
	a := acquired(t)(lc.Acquire(ctx, ns, "job", "a", 600, 1))
	grant(t, ns, "dev", "", []string{"configmaps"}, []string{"*"})
	dev := asUser(t, "dev")
	if err := dev.Create(ctx, guarded(ns, "cm", guardOf("job", 0, a.Token), "x")); err != nil {
		t.Fatal(err)
	}
	record := stored(t, ns, "cm").Annotations[permit.FenceAnnotation]

	long := metav1.NewMicroTime(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC))
	expired := func(p *locksv1alpha1.QueenLock) {
		p.Spec.AcquireTime, p.Spec.RenewTime, p.Spec.ExpireTime = &long, &long, &long
		p.Spec.TTLSeconds = 1
	}
	for _, c := range []struct {
		name  string
		old   func(*locksv1alpha1.QueenLock)
		owner string
	}{
		{"a version far ahead of the stored one", func(p *locksv1alpha1.QueenLock) { p.ResourceVersion = "999999999999"; expired(p) }, "attacker"},
		{"the stored version with times long past", expired, "attacker"},
		{"the stored version, long past, and the holder's own owner", expired, "a"},
	} {
		t.Run(c.name, func(t *testing.T) {
			live := storedPermit(t, ns, permit.Name("job", 0))
			old := live.DeepCopy()
			c.old(old)
			obj := live.DeepCopy()
			obj.Spec.Owner = c.owner
			obj.Spec.AcquireTime, obj.Spec.RenewTime, obj.Spec.ExpireTime = nil, nil, nil
			r := forge(t, webhook.MutatePath, permitReview(t, old, obj))
			if r.Allowed {
				t.Errorf("the forged takeover was allowed")
			}
			if got := stored(t, ns, "cm").Annotations[permit.FenceAnnotation]; got != record {
				t.Fatalf("a forged review raised the holder's object: record %q, then %q", record, got)
			}
		})
	}
	if err := write(ctx, ns, "cm", guardOf("job", 0, a.Token), "still mine"); err != nil {
		t.Fatalf("the holder's write after the forged reviews: %v", err)
	}
}

func permitReview(t *testing.T, old, obj *locksv1alpha1.QueenLock) admissionv1.AdmissionRequest {
	t.Helper()
	raw := func(p *locksv1alpha1.QueenLock) runtime.RawExtension {
		p.APIVersion, p.Kind = locksv1alpha1.GroupVersion.String(), "QueenLock"
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		return runtime.RawExtension{Raw: b}
	}
	return admissionv1.AdmissionRequest{
		Kind:      metav1.GroupVersionKind{Group: locksv1alpha1.GroupVersion.Group, Version: locksv1alpha1.GroupVersion.Version, Kind: "QueenLock"},
		Resource:  metav1.GroupVersionResource{Group: locksv1alpha1.GroupVersion.Group, Version: locksv1alpha1.GroupVersion.Version, Resource: "queenlocks"},
		Operation: admissionv1.Update, Namespace: old.Namespace, Name: old.Name,
		UserInfo: authenticationv1.UserInfo{Username: "system:anonymous"},
		Object:   raw(obj), OldObject: raw(old),
	}
}
