package webhook_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/route"
)

// storedPermit reads permit name in ns as the API server has it.
func storedPermit(t *testing.T, ns, name string) *locksv1alpha1.QueenLock {
	t.Helper()
	got := &locksv1alpha1.QueenLock{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, got); err != nil {
		t.Fatal(err)
	}
	return got
}

// serverSideApply applies lock's slot 0 as field manager, without forcing
// conflicts: kubectl apply --server-side --field-manager=manager.
func serverSideApply(c client.Client, ns, lock, owner string, ttl int64, manager string) error {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": locksv1alpha1.GroupVersion.String(), "kind": "QueenLock",
		"metadata": map[string]any{"namespace": ns, "name": lock + ".0"},
		"spec":     map[string]any{"lock": lock, "slot": 0, "limit": 1, "owner": owner, "ttlSeconds": ttl},
	}}
	//nolint:staticcheck // client.Apply with unstructured is how SSA is sent without generated apply configurations.
	return c.Patch(context.Background(), u, client.Apply, client.FieldOwner(manager))
}

// A permit being deleted (a foreground delete leaves it with a finalizer)
// takes no write but the manager's finalizer removal. A write that changes
// only managedFields (a merge patch, or a server-side apply of the values
// it has) is neither refused nor stamped; the webhook drops the
// managedFields, so it changes nothing and is not stored: the token stays.
func TestAPermitBeingDeletedTakesNoManagedFieldsWrite(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	grant(t, ns, "dev", locksv1alpha1.GroupVersion.Group, []string{"queenlocks"}, []string{"*"})
	dev := asUser(t, "dev")
	entry := `[{"manager":"x","operation":"Update","apiVersion":"locks.queen.dev/v1alpha1","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{"f:owner":{}}}}]`
	writes := map[string]func(p *locksv1alpha1.QueenLock) error{
		"merge patch of managedFields": func(p *locksv1alpha1.QueenLock) error {
			return dev.Patch(ctx, p.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"managedFields":`+entry+`}}`)))
		},
		"server-side apply of the stored values": func(p *locksv1alpha1.QueenLock) error {
			return serverSideApply(dev, ns, p.Spec.Lock, p.Spec.Owner, p.Spec.TTLSeconds, "kubectl")
		},
	}
	i := 0
	for name, write := range writes {
		i++
		t.Run(name, func(t *testing.T) {
			p := newPermit(ns, fmt.Sprintf("deleting-%d", i), 0, 1, "a", 600)
			if err := env.Client.Create(ctx, p); err != nil {
				t.Fatal(err)
			}
			if err := env.Client.Delete(ctx, p, client.PropagationPolicy("Foreground")); err != nil {
				t.Fatal(err)
			}
			before := storedPermit(t, ns, p.Name)
			err := write(before)
			after := storedPermit(t, ns, p.Name)
			if after.ResourceVersion != before.ResourceVersion || len(after.ManagedFields) > 0 {
				t.Errorf("%s of a permit being deleted (%v): rv %s -> %s, stored managedFields %v",
					name, err, before.ResourceVersion, after.ResourceVersion, after.ManagedFields)
			}
			// The manager's own removal still finishes the delete.
			done := after.DeepCopy()
			done.Finalizers = nil
			if err := env.Client.Update(ctx, done); err != nil {
				t.Fatalf("the manager's finalizer removal: %v", err)
			}
		})
	}
}

// A renew through the route of a permit being deleted is lost, whatever
// token it carries: deleting a permit releases it, and check already
// answers kv_precondition for it. With the permit's current
// resourceVersion (read with kubectl get after the foreground delete) and
// the same owner and TTL, the merge patch changes nothing (the webhook lets
// a write to a permit being deleted through unstamped), and the route must
// not answer renewed:true with an unchanged token and the old expiresAt.
func TestARouteRenewOfAPermitBeingDeletedIsLost(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	url, _ := env.ServeRoute(t, route.AuthNone, ns)
	call := func(op string) map[string]any {
		t.Helper()
		resp, err := http.Post(url, "application/json", strings.NewReader(`{"namespace":"`+ns+`","operations":[`+op+`]}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct{ Results []map[string]any }
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK || len(out.Results) != 1 {
			t.Fatalf("%s: %d %v %v", op, resp.StatusCode, out, err)
		}
		return out.Results[0]
	}
	if r := call(`{"op":"acquire","name":"gone","owner":"a","ttlSeconds":600}`); r["acquired"] != true {
		t.Fatalf("acquire: %v", r)
	}
	if err := env.Client.Delete(ctx, newPermit(ns, "gone", 0, 1, "a", 600), client.PropagationPolicy("Foreground")); err != nil {
		t.Fatal(err)
	}
	rv := storedPermit(t, ns, "gone.0").ResourceVersion
	if r := call(`{"op":"check","name":"gone","expect":` + rv + `}`); r["ok"] != false {
		t.Fatalf("check of a permit being deleted: %v", r)
	}
	r := call(`{"op":"renew","name":"gone","owner":"a","ttlSeconds":600,"token":` + rv + `}`)
	if r["renewed"] != false || r["reason"] != "lost" {
		t.Fatalf("renew of a permit being deleted, with its current resourceVersion %s: %v, want renewed false, reason lost", rv, r)
	}
}
