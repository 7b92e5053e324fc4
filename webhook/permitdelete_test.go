package webhook_test

import (
	"context"
	"encoding/json"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// The garbage collector finishes a foreground or orphan delete by removing
// its finalizer with a JSON merge patch of metadata.finalizers carrying the
// resourceVersion it read (pkg/controller/garbagecollector, removeFinalizer).
// The webhook must admit exactly that, and nothing else, on a permit being
// deleted. No expiry controller runs in this suite, so the patch here is the
// only thing that can let the permit go.
func TestTheGarbageCollectorFinishesACascadingDelete(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	for _, c := range []struct {
		policy    metav1.DeletionPropagation
		finalizer string
	}{
		{metav1.DeletePropagationForeground, metav1.FinalizerDeleteDependents},
		{metav1.DeletePropagationOrphan, metav1.FinalizerOrphanDependents},
	} {
		p := newPermit(ns, "gc-"+string(c.finalizer[:6]), 0, 1, "a", 600)
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Delete(ctx, p, client.PropagationPolicy(c.policy)); err != nil {
			t.Fatal(err)
		}
		cur := &locksv1alpha1.QueenLock{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), cur); err != nil {
			t.Fatal(err)
		}
		if cur.DeletionTimestamp == nil || len(cur.Finalizers) != 1 || cur.Finalizers[0] != c.finalizer {
			t.Fatalf("%s delete: deletionTimestamp %v finalizers %v", c.policy, cur.DeletionTimestamp, cur.Finalizers)
		}
		// A renew of a permit being deleted is lost: deleting it released it.
		renew := cur.DeepCopy()
		renew.Spec.TTLSeconds = 700
		if err := env.Client.Update(ctx, renew); reason(err) != permit.ReasonLost {
			t.Fatalf("renew of a deleted permit: %v, want lost", err)
		}
		// Nor may anything but finalizer removal write it.
		label := cur.DeepCopy()
		label.Labels["x"] = "y"
		if err := env.Client.Update(ctx, label); err == nil {
			t.Fatal("a label edit of a permit being deleted was admitted")
		}
		gcPatch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": cur.ResourceVersion, "finalizers": []string{}}})
		if err := env.Client.Patch(ctx, cur, client.RawPatch(types.MergePatchType, gcPatch)); err != nil {
			t.Fatalf("the garbage collector's finalizer removal was refused: %v", err)
		}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), cur); !apierrors.IsNotFound(err) {
			t.Fatalf("after the finalizer removal: %v, want not found", err)
		}
	}
}

// Lock-label edits of a held permit are refused, not undone and stored as
// a renew: they would change the token without a transition.
func TestLockLabelEditsAreRefused(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	p := newPermit(ns, "labelled", 0, 1, "a", 600)
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	for _, patch := range []map[string]any{
		{"metadata": map[string]any{"labels": map[string]any{permit.LockLabel: "x"}}},
		{"metadata": map[string]any{"labels": map[string]any{permit.LockLabel: nil}}},
		{"metadata": map[string]any{"labels": map[string]any{"team": "a"}}},
		{"metadata": map[string]any{"annotations": map[string]any{"note": "x"}}},
	} {
		body, _ := json.Marshal(patch)
		if err := env.Client.Patch(ctx, p.DeepCopy(), client.RawPatch(types.MergePatchType, body)); err == nil {
			t.Fatalf("patch %s was admitted", body)
		}
	}
	cur := &locksv1alpha1.QueenLock{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), cur); err != nil || cur.ResourceVersion != p.ResourceVersion {
		t.Fatalf("the permit was written: rv %s, want %s (%v)", cur.ResourceVersion, p.ResourceVersion, err)
	}
}
