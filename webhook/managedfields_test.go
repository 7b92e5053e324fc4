package webhook_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

// Permits are stored without managedFields whichever way they are written,
// and a write to a permit stored without them (which the webhook then has
// nothing to remove from) is admitted as before.
func TestPermitsAreStoredWithoutManagedFields(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	stored := func(name string) *locksv1alpha1.QueenLock {
		t.Helper()
		got := &locksv1alpha1.QueenLock{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, got); err != nil {
			t.Fatal(err)
		}
		if len(got.ManagedFields) > 0 {
			t.Fatalf("permit %s stored with managedFields %+v", name, got.ManagedFields)
		}
		return got
	}

	p := newPermit(ns, "mf", 0, 1, "a", 1)
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	created := stored(p.Name)

	// A renew by merge patch, the route's and the handles' way.
	body, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": created.ResourceVersion},
		"spec":     map[string]any{"owner": "a", "ttlSeconds": 1},
	})
	if err := env.Client.Patch(ctx, created.DeepCopy(), client.RawPatch(types.MergePatchType, body)); err != nil {
		t.Fatalf("renew of a permit stored without managedFields: %v", err)
	}
	renewed := stored(p.Name)
	if token(t, renewed) <= token(t, created) {
		t.Fatalf("renew did not move the token: %s then %s", created.ResourceVersion, renewed.ResourceVersion)
	}

	// A takeover by update, once it has expired.
	waitExpired(t, renewed)
	next := renewed.DeepCopy()
	next.Spec.AcquireTime, next.Spec.Owner, next.Spec.TTLSeconds = nil, "b", 30
	if err := env.Client.Update(ctx, next); err != nil {
		t.Fatalf("takeover: %v", err)
	}
	if got := stored(p.Name); got.Spec.Owner != "b" {
		t.Fatalf("owner after takeover = %q", got.Spec.Owner)
	}

	// A create by server-side apply (kubectl apply --server-side), which
	// records the applier's fields before admission.
	applied := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": locksv1alpha1.GroupVersion.String(), "kind": "QueenLock",
		"metadata": map[string]any{"namespace": ns, "name": newPermit(ns, "mf-applied", 0, 1, "c", 30).Name},
		"spec":     map[string]any{"lock": "mf-applied", "slot": 0, "limit": 1, "owner": "c", "ttlSeconds": 30},
	}}
	//nolint:staticcheck // client.Apply with unstructured is how SSA is sent without generated apply configurations.
	if err := env.Client.Patch(ctx, applied, client.Apply, client.FieldOwner("kubectl"), client.ForceOwnership); err != nil {
		t.Fatalf("server-side apply: %v", err)
	}
	if got := stored(applied.GetName()); got.Spec.ExpireTime == nil || time.Until(got.Spec.ExpireTime.Time) < 25*time.Second {
		t.Fatalf("applied permit not stamped: %+v", got.Spec)
	}
}
