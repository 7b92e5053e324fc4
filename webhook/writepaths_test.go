package webhook_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// asUser is a client that acts as user, impersonated by the admin: a
// namespace user as kubectl would be, not a cluster administrator.
func asUser(t *testing.T, user string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	c, err := client.New(cfg, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// grant gives user the verbs on resources of group in ns.
func grant(t *testing.T, ns, user, group string, resources, verbs []string) {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("%s-%s", user, strings.Join(resources, "-"))
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{group}, Resources: resources, Verbs: verbs}}}
	bind := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}}}
	for _, o := range []client.Object{role, bind} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
}

// holders sets up lock "job" in ns with a replaced holder A (its guard is
// stale) and the current holder B, and another lock and another slot held
// now by others. It answers the guards.
type holders struct{ stale, current, otherLock, otherSlot string }

func setUpHolders(t *testing.T, ns string) holders {
	t.Helper()
	ctx := context.Background()
	a := newPermit(ns, "job", 0, 2, "a", 1)
	if err := env.Client.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	waitExpired(t, a)
	b := a.DeepCopy()
	b.Spec.AcquireTime, b.Spec.Owner, b.Spec.TTLSeconds = nil, "b", 600
	if err := env.Client.Update(ctx, b); err != nil {
		t.Fatal(err)
	}
	other := newPermit(ns, "other", 0, 1, "c", 600)
	slot1 := newPermit(ns, "job", 1, 2, "d", 600)
	for _, p := range []*locksv1alpha1.QueenLock{other, slot1} {
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	return holders{
		stale:     fmt.Sprintf("job#0=%d", token(t, a)),
		current:   fmt.Sprintf("job#0=%d", token(t, b)),
		otherLock: fmt.Sprintf("other#0=%d", token(t, other)),
		otherSlot: fmt.Sprintf("job#1=%d", token(t, slot1)),
	}
}

// writePath writes value to ConfigMap name with guard ("" sends none), the
// way one kind of client does.
type writePath func(ctx context.Context, c client.Client, ns, name, guard, value string) error

func withGuard(annotations map[string]any, guard string) map[string]any {
	if guard != "" {
		annotations[permit.GuardAnnotation] = guard
	}
	return annotations
}

var writePaths = map[string]writePath{
	// kubectl edit, or a client's read-modify-write.
	"update": func(ctx context.Context, c client.Client, ns, name, guard, value string) error {
		cm := &corev1.ConfigMap{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cm); err != nil {
			return err
		}
		if guard != "" {
			cm.Annotations[permit.GuardAnnotation] = guard
		}
		cm.Data["report"] = value
		return c.Update(ctx, cm)
	},
	// kubectl patch --type=merge, kubectl annotate, kubectl label.
	"merge patch": func(ctx context.Context, c client.Client, ns, name, guard, value string) error {
		body, _ := json.Marshal(map[string]any{
			"metadata": map[string]any{"annotations": withGuard(map[string]any{}, guard)},
			"data":     map[string]any{"report": value},
		})
		return c.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.RawPatch(types.MergePatchType, body))
	},
	// kubectl patch --type=json.
	"JSON patch": func(ctx context.Context, c client.Client, ns, name, guard, value string) error {
		ops := []map[string]any{{"op": "replace", "path": "/data/report", "value": value}}
		if guard != "" {
			ops = append(ops, map[string]any{"op": "add", "path": "/metadata/annotations/locks.queen.dev~1guard", "value": guard})
		}
		body, _ := json.Marshal(ops)
		return c.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.RawPatch(types.JSONPatchType, body))
	},
	// kubectl apply --server-side, Argo CD, Flux.
	"server-side apply": func(ctx context.Context, c client.Client, ns, name, guard, value string) error {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"namespace": ns, "name": name,
				"labels":      map[string]any{permit.GuardedLabel: "true"},
				"annotations": withGuard(map[string]any{}, guard)},
			"data": map[string]any{"report": value},
		}}
		//nolint:staticcheck // client.Apply with unstructured is how SSA is sent without generated apply configurations.
		return c.Patch(ctx, u, client.Apply, client.FieldOwner("applier"), client.ForceOwnership)
	},
	// kubectl replace: the whole object, as the client has it.
	"replace": func(ctx context.Context, c client.Client, ns, name, guard, value string) error {
		cm := &corev1.ConfigMap{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cm); err != nil {
			return err
		}
		fresh := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: cm.ResourceVersion,
			Labels: map[string]string{permit.GuardedLabel: "true"}, Annotations: map[string]string{}},
			Data: map[string]string{"report": value}}
		if guard != "" {
			fresh.Annotations[permit.GuardAnnotation] = guard
		}
		return c.Update(ctx, fresh)
	},
	// kubectl replace --force: delete, then create. A delete carries no
	// guard, so it is made deletable under the guard first, as
	// docs/fencing.md says.
	"replace --force": func(ctx context.Context, c client.Client, ns, name, guard, value string) error {
		if err := markDeletable(ctx, c, ns, name, guard); err != nil {
			return err
		}
		if err := c.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
			return err
		}
		return c.Create(ctx, guardedCM(ns, name, guard, value))
	},
	// A stale holder deleting and creating again with its own content,
	// without marking: the delete alone.
	"delete then create": func(ctx context.Context, c client.Client, ns, name, guard, value string) error {
		if err := c.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
			return err
		}
		return c.Create(ctx, guardedCM(ns, name, guard, value))
	},
	// Taking the object out of the fence: kubectl label guarded-.
	"remove the opt-in label": func(ctx context.Context, c client.Client, ns, name, guard, value string) error {
		body, _ := json.Marshal(map[string]any{
			"metadata": map[string]any{"labels": map[string]any{permit.GuardedLabel: nil}, "annotations": withGuard(map[string]any{}, guard)},
			"data":     map[string]any{"report": value},
		})
		return c.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.RawPatch(types.MergePatchType, body))
	},
}

func guardedCM(ns, name, guard, value string) *corev1.ConfigMap {
	cm := guarded(ns, name, guard, value)
	return cm
}

func markDeletable(ctx context.Context, c client.Client, ns, name, guard string) error {
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": withGuard(map[string]any{permit.DeletableAnnotation: "true"}, guard)}})
	return c.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.RawPatch(types.MergePatchType, body))
}

// TestEveryWritePathNeedsItsOwnCurrentGuard writes a guarded ConfigMap
// every way a Kubernetes client can, as an ordinary namespace user, with
// the current holder's guard, a replaced holder's and none: only the
// current guard's writes land, nothing of a refused write is stored, no
// guard is kept on the object, and its record names the current guard.
func TestEveryWritePathNeedsItsOwnCurrentGuard(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	h := setUpHolders(t, ns)
	grant(t, ns, "dev", "", []string{"configmaps", "secrets"}, []string{"*"})
	dev := asUser(t, "dev")
	guards := map[string]string{"current": h.current, "stale": h.stale, "none": ""}
	i := 0
	for path, write := range writePaths {
		for kind, guard := range guards {
			i++
			name := fmt.Sprintf("out-%d", i)
			t.Run(path+"/"+kind, func(t *testing.T) {
				if err := dev.Create(ctx, guarded(ns, name, h.current, "by B")); err != nil {
					t.Fatalf("B's first write: %v", err)
				}
				err := write(ctx, dev, ns, name, guard, "new")
				cm := &corev1.ConfigMap{}
				getErr := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cm)
				// A bare delete carries no guard: refused whoever sends it.
				if kind != "current" || path == "delete then create" {
					refusedWith(t, err)
					if getErr != nil || cm.Data["report"] != "by B" {
						t.Fatalf("after a refused write the object is %v (%v), want B's", cm.Data, getErr)
					}
					if cm.Annotations[permit.FenceAnnotation] != h.current {
						t.Fatalf("record %q, want %q", cm.Annotations[permit.FenceAnnotation], h.current)
					}
					return
				}
				if err != nil {
					t.Fatalf("the current holder's write was refused: %v", err)
				}
				if getErr != nil || cm.Data["report"] != "new" {
					t.Fatalf("stored %v (%v), want the write", cm.Data, getErr)
				}
				if g, ok := cm.Annotations[permit.GuardAnnotation]; ok {
					t.Fatalf("the guard %q was stored: a later write would inherit it", g)
				}
				want := h.current
				if path == "remove the opt-in label" {
					want = "" // out of the fence: no record binds it any more
				}
				if got := cm.Annotations[permit.FenceAnnotation]; got != want {
					t.Fatalf("record %q, want %q", got, want)
				}
			})
		}
	}

	// Guards of a lock or slot the object is not bound to, though held now.
	if err := dev.Create(ctx, guarded(ns, "bound", h.current, "by B")); err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{h.otherLock, h.otherSlot} {
		refusedWith(t, writePaths["update"](ctx, dev, ns, "bound", g, "other"), `bound to lock "job" slot 0`)
	}

	// A record the client writes itself is never kept: on create, by
	// patch, or planted before the object opts in.
	planted := "job#0=999999999"
	cm := guarded(ns, "planted", h.current, "by B")
	cm.Annotations[permit.FenceAnnotation] = planted
	if err := dev.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	plain := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "opt-in-later",
		Annotations: map[string]string{permit.FenceAnnotation: planted}}, Data: map[string]string{"report": "x"}}
	if err := dev.Create(ctx, plain); err != nil {
		t.Fatal(err)
	}
	optIn, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"labels": map[string]any{permit.GuardedLabel: "true"}, "annotations": map[string]any{permit.GuardAnnotation: h.current}}})
	if err := dev.Patch(ctx, plain, client.RawPatch(types.MergePatchType, optIn)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"planted", "opt-in-later"} {
		if got := stored(t, ns, name).Annotations[permit.FenceAnnotation]; got != h.current {
			t.Fatalf("%s: record %q, want the guard's %q", name, got, h.current)
		}
	}
	noGuardOptIn, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{permit.GuardedLabel: "true"}}})
	plain2 := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "opt-in-unguarded"}, Data: map[string]string{"report": "x"}}
	if err := dev.Create(ctx, plain2); err != nil {
		t.Fatal(err)
	}
	refusedWith(t, dev.Patch(ctx, plain2, client.RawPatch(types.MergePatchType, noGuardOptIn)))
	// The mark of one token does not carry over to the next holder's.
	if err := markDeletable(ctx, dev, ns, "planted", "job#0=5"); err == nil {
		t.Fatal("a stale guard marked the object deletable")
	}
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		permit.DeletableAnnotation: "12345", permit.GuardAnnotation: h.current}}})
	refusedWith(t, dev.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "planted"}},
		client.RawPatch(types.MergePatchType, body)), "true")
}

// TestDeletingAGuardedObject covers the ways a guarded object may still be
// deleted: by the current holder after marking it, while its namespace is
// being deleted, and by an administrator with the override right.
func TestDeletingAGuardedObject(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	h := setUpHolders(t, ns)
	grant(t, ns, "dev", "", []string{"configmaps"}, []string{"*"})
	dev := asUser(t, "dev")
	del := func(c client.Client, name string) error {
		return c.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
	}
	for _, name := range []string{"a", "b", "c", "d"} {
		if err := dev.Create(ctx, guarded(ns, name, h.current, "v")); err != nil {
			t.Fatal(err)
		}
	}
	// Unmarked: nobody without the override deletes it, DeleteCollection
	// (kubectl delete cm --all) included.
	refusedWith(t, del(dev, "a"), "deletable")
	refusedWith(t, dev.DeleteAllOf(ctx, &corev1.ConfigMap{}, client.InNamespace(ns), client.MatchingLabels{permit.GuardedLabel: "true"}))
	// Marked under the current guard: deleted.
	if err := markDeletable(ctx, dev, ns, "a", h.current); err != nil {
		t.Fatal(err)
	}
	if err := del(dev, "a"); err != nil {
		t.Fatalf("delete after marking: %v", err)
	}
	// The override needs its right: the annotation alone is refused.
	override, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{permit.OverrideAnnotation: "cleanup"}},
		"data": map[string]any{"report": "by the admin"}})
	refusedWith(t, dev.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "b"}}, client.RawPatch(types.MergePatchType, override)), "override")
	grant(t, ns, "ops", "", []string{"configmaps"}, []string{"*"})
	grant(t, ns, "ops", locksv1alpha1.GroupVersion.Group, []string{"guards"}, []string{"override"})
	ops := asUser(t, "ops")
	if err := ops.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "b"}}, client.RawPatch(types.MergePatchType, override)); err != nil {
		t.Fatalf("override by a user with the right: %v", err)
	}
	b := stored(t, ns, "b")
	for _, k := range []string{permit.OverrideAnnotation, permit.FenceAnnotation, permit.GuardAnnotation} {
		if _, ok := b.Annotations[k]; ok {
			t.Fatalf("annotation %s kept after the override: %v", k, b.Annotations)
		}
	}
	if _, ok := b.Labels[permit.GuardedLabel]; ok || b.Data["report"] != "by the admin" {
		t.Fatalf("after the override: labels %v, data %v", b.Labels, b.Data)
	}
	if err := del(ops, "c"); err != nil {
		t.Fatalf("delete by a user with the override right: %v", err)
	}
	// A namespace being deleted takes its guarded objects with it. No
	// namespace controller runs here; delete the object as it would.
	if err := env.Client.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	if err := del(dev, "d"); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete in a terminating namespace: %v", err)
	}
}

// While an object is unlabelled no webhook sees its writes, so what it
// carries when it opts in may have been planted by anybody: a guard or a
// deletable mark kept from then is not the opt-in write's own.
func TestNothingPlantedBeforeOptingInCounts(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	h := setUpHolders(t, ns)
	grant(t, ns, "dev", "", []string{"configmaps"}, []string{"*"})
	dev := asUser(t, "dev")
	optIn := func(name string, annotations map[string]any) error {
		body, _ := json.Marshal(map[string]any{"metadata": map[string]any{
			"labels": map[string]any{permit.GuardedLabel: "true"}, "annotations": annotations}})
		return dev.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.RawPatch(types.MergePatchType, body))
	}
	// A guard planted before: the label write sends none of its own.
	planted := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "planted-guard",
		Annotations: map[string]string{permit.GuardAnnotation: h.current}}}
	if err := dev.Create(ctx, planted); err != nil {
		t.Fatal(err)
	}
	refusedWith(t, optIn("planted-guard", map[string]any{}), "before it opted in")
	// A deletable mark planted before: dropped at the opt-in, so a bare
	// delete is still refused.
	marked := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "planted-mark",
		Annotations: map[string]string{permit.DeletableAnnotation: "true"}}}
	if err := dev.Create(ctx, marked); err != nil {
		t.Fatal(err)
	}
	if err := optIn("planted-mark", map[string]any{permit.GuardAnnotation: h.current}); err != nil {
		t.Fatalf("opting in under the current guard: %v", err)
	}
	if _, ok := stored(t, ns, "planted-mark").Annotations[permit.DeletableAnnotation]; ok {
		t.Fatal("a mark planted before the opt-in was kept")
	}
	refusedWith(t, dev.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "planted-mark"}}), "deletable")
}
