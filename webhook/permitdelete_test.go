package webhook_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// A foreground or orphan delete leaves the permit with a finalizer. Only
// the manager removes it, with an update naming the object's UID: the
// garbage collector's patch (pkg/controller/garbagecollector,
// removeFinalizer: a JSON merge patch of metadata.finalizers with the
// resourceVersion it read) and anybody else's are refused, because when a
// patch empties the finalizers kube-apiserver deletes whatever permit has
// the name by then. No deletion controller runs in this suite, so the
// writes here are the only ones. The manager of this suite runs as the
// admin; "gc" stands for the garbage collector or any user.
func TestOnlyTheManagerFinishesACascadingDelete(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	grant(t, ns, "gc", locksv1alpha1.GroupVersion.Group, []string{"queenlocks"}, []string{"get", "update", "patch"})
	other := asUser(t, "gc")
	for _, c := range []struct {
		policy    metav1.DeletionPropagation
		finalizer string
	}{
		{metav1.DeletePropagationForeground, metav1.FinalizerDeleteDependents},
		{metav1.DeletePropagationOrphan, metav1.FinalizerOrphanDependents},
	} {
		p := newPermit(ns, "gc-"+c.finalizer[:6], 0, 1, "a", 600)
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
		if err := other.Patch(ctx, cur.DeepCopy(), client.RawPatch(types.MergePatchType, gcPatch)); !onlyTheManager(err) {
			t.Fatalf("a patch removing the finalizers of a permit being deleted: %v, want refused", err)
		}
		byOther := cur.DeepCopy()
		byOther.Finalizers = nil
		if err := other.Update(ctx, byOther); !onlyTheManager(err) {
			t.Fatalf("another user's update removing the finalizers: %v, want refused", err)
		}
		// The manager's update (this suite's manager runs as the admin).
		done := cur.DeepCopy()
		done.Finalizers = nil
		if err := env.Client.Update(ctx, done); err != nil {
			t.Fatalf("the manager's finalizer removal was refused: %v", err)
		}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), cur); !apierrors.IsNotFound(err) {
			t.Fatalf("after the finalizer removal: %v, want not found", err)
		}
	}
}

// onlyTheManager is whether err is the webhook's refusal of a finalizer
// removal by anybody but the manager's update (not RBAC's).
func onlyTheManager(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "only the queen-locks manager removes its finalizers")
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
