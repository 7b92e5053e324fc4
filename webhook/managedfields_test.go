package webhook_test

import (
	"context"
	"encoding/json"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

// Permits written by creates, patches and updates are stored without
// managedFields, and a write to a permit stored without them (which the
// webhook then has nothing to remove from) is admitted as before.
func TestPermitsAreStoredWithoutManagedFields(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	stored := func(name string) *locksv1alpha1.QueenLock {
		t.Helper()
		got := storedPermit(t, ns, name)
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

	// A renew by merge patch, the handles' direct transport's way.
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
}

// A permit created by server-side apply and renewed by the same field
// manager with a new TTL is a renew: the applier owns every field it sent.
// Had the webhook dropped managedFields, the API server would find none on
// the next apply and give every stored field to "before-first-apply", and
// the renew would fail with 409 "conflict with before-first-apply:
// .spec.ttlSeconds" unless forced.
func TestAServerSideAppliedPermitKeepsItsRecord(t *testing.T) {
	ns := namespace(t)
	grant(t, ns, "dev", locksv1alpha1.GroupVersion.Group, []string{"queenlocks"}, []string{"*"})
	dev := asUser(t, "dev")
	if err := serverSideApply(dev, ns, "ssa", "a", 600, "deploy"); err != nil {
		t.Fatalf("create by server-side apply: %v", err)
	}
	created := storedPermit(t, ns, "ssa.0")
	if len(created.ManagedFields) == 0 {
		t.Fatal("a permit created by server-side apply was stored without the applier's managedFields")
	}
	if err := serverSideApply(dev, ns, "ssa", "a", 700, "deploy"); err != nil {
		t.Fatalf("renew by the same field manager with a new TTL: %v", err)
	}
	renewed := storedPermit(t, ns, "ssa.0")
	if renewed.Spec.TTLSeconds != 700 || token(t, renewed) <= token(t, created) {
		t.Fatalf("after the renew: ttl %d, token %s after %s", renewed.Spec.TTLSeconds, renewed.ResourceVersion, created.ResourceVersion)
	}
}
