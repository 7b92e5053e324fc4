package guard

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/permit"
)

// Create labels an object of a guarded kind guarded and creates it under
// the current guard.
func (g *Client) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if ok, err := g.guardedKind("create", obj); err != nil || !ok {
		if err != nil {
			return err
		}
		return g.Client.Create(ctx, obj, opts...)
	}
	labels, annotations := obj.GetLabels(), obj.GetAnnotations()
	err := g.send(ctx, "create", obj, func(f Fence) error {
		obj.SetLabels(with(labels, permit.GuardedLabel, "true"))
		obj.SetAnnotations(with(annotations, permit.GuardAnnotation, f.Annotation()))
		return g.Client.Create(ctx, obj, opts...)
	})
	if err != nil {
		// Leave no token on the caller's object, where a later write
		// through another client would send it.
		obj.SetLabels(labels)
		obj.SetAnnotations(annotations)
	}
	return err
}

// Update updates a guarded object under the current guard. An object of a
// guarded kind that is not labelled guarded is sent without a guard, unless
// the stored one is guarded (the update then takes it out of the fence,
// which takes the guard too).
func (g *Client) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	const verb = "update"
	if ok, err := g.guarded(ctx, verb, obj); err != nil || !ok {
		if err != nil {
			return err
		}
		return g.Client.Update(ctx, obj, opts...)
	}
	annotations := obj.GetAnnotations()
	err := g.send(ctx, "update", obj, func(f Fence) error {
		obj.SetAnnotations(with(annotations, permit.GuardAnnotation, f.Annotation()))
		return g.Client.Update(ctx, obj, opts...)
	})
	if err != nil {
		obj.SetAnnotations(annotations)
	}
	return err
}

// Patch patches a guarded object under the current guard: the guard is
// added to a merge, strategic merge or JSON patch as it is sent. A server-
// side apply patch (client.Apply) is treated as Apply treats it, labelled
// guarded. A JSON patch adds the guard to the object's annotations, which a
// guarded object always has; to opt an object in, use a merge patch.
func (g *Client) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	const verb = "patch"
	if patch.Type() == types.ApplyPatchType {
		if ok, err := g.guardedKind("apply", obj); err != nil || !ok {
			if err != nil {
				return err
			}
			return g.Client.Patch(ctx, obj, patch, opts...)
		}
		labels, annotations := obj.GetLabels(), obj.GetAnnotations()
		err := g.send(ctx, "apply", obj, func(f Fence) error {
			obj.SetLabels(with(labels, permit.GuardedLabel, "true"))
			obj.SetAnnotations(with(annotations, permit.GuardAnnotation, f.Annotation()))
			return g.Client.Patch(ctx, obj, patch, opts...)
		})
		if err != nil {
			obj.SetLabels(labels)
			obj.SetAnnotations(annotations)
		}
		return err
	}
	if ok, err := g.guarded(ctx, verb, obj); err != nil || !ok {
		if err != nil {
			return err
		}
		return g.Client.Patch(ctx, obj, patch, opts...)
	}
	return g.send(ctx, "patch", obj, func(f Fence) error {
		return g.Client.Patch(ctx, obj, guardedPatch{Patch: patch, fence: f}, opts...)
	})
}

// Apply applies a configuration of a guarded kind labelled guarded, under
// the current guard. The configuration is sent as unstructured, and the
// object the server answers is decoded back into it.
func (g *Client) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	raw, err := json.Marshal(obj)
	if err != nil {
		return fmt.Errorf("queen-locks guard: encoding the apply configuration: %w", err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(raw); err != nil {
		return fmt.Errorf("queen-locks guard: reading the apply configuration: %w", err)
	}
	if err := g.usable("apply", u); err != nil {
		return err
	}
	if !g.kinds[u.GroupVersionKind().GroupKind()] {
		return g.Client.Apply(ctx, obj, opts...)
	}
	labels, annotations := u.GetLabels(), u.GetAnnotations()
	err = g.send(ctx, "apply", u, func(f Fence) error {
		u.SetLabels(with(labels, permit.GuardedLabel, "true"))
		u.SetAnnotations(with(annotations, permit.GuardAnnotation, f.Annotation()))
		return g.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), opts...)
	})
	if err != nil {
		return err
	}
	out, err := u.MarshalJSON()
	if err == nil {
		err = json.Unmarshal(out, obj)
	}
	if err != nil {
		return fmt.Errorf("queen-locks guard: applied %s, but decoding the answer: %w", objName(u), err)
	}
	return nil
}

// Delete deletes a guarded object under the current guard. A delete
// carries no annotations, so it is two writes, as the webhook asks: a patch
// under the guard that marks the object deletable, then the delete with the
// marked version as its precondition, so that nothing written in between
// is deleted unseen. A resourceVersion precondition the caller gives
// applies to the mark.
//
// A dry run sends the mark as a dry run (the guard judges the token as it
// would) and no delete: kube-apiserver would judge a dry-run delete
// against the stored object, which a dry-run mark leaves unmarked, so it
// would be refused whatever the token. Nothing is written.
func (g *Client) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	if ok, err := g.guardedKind("delete", obj); err != nil || !ok {
		if err != nil {
			return err
		}
		return g.Client.Delete(ctx, obj, opts...)
	}
	do := &client.DeleteOptions{}
	do.ApplyOptions(opts)
	var want string // the caller's precondition
	if do.Preconditions != nil && do.Preconditions.ResourceVersion != nil {
		want = *do.Preconditions.ResourceVersion
	}
	stored, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		return fmt.Errorf("queen-locks guard: %T is not a client.Object", obj)
	}
	for try := 0; ; try++ {
		if err := g.Client.Get(ctx, client.ObjectKeyFromObject(obj), stored); err != nil {
			return err
		}
		if stored.GetLabels()[permit.GuardedLabel] != "true" {
			return g.Client.Delete(ctx, obj, opts...)
		}
		base := stored.GetResourceVersion()
		if want != "" {
			base = want
		}
		err := g.send(ctx, "delete", obj, func(f Fence) error {
			mark, err := json.Marshal(map[string]any{"metadata": map[string]any{
				"resourceVersion": base,
				"annotations": map[string]string{
					permit.DeletableAnnotation: "true",
					permit.GuardAnnotation:     f.Annotation(),
				},
			}})
			if err != nil {
				return err
			}
			marked := stored.DeepCopyObject().(client.Object)
			if len(do.DryRun) > 0 {
				return g.Client.Patch(ctx, marked, client.RawPatch(types.MergePatchType, mark), client.DryRunAll)
			}
			if err := g.Client.Patch(ctx, marked, client.RawPatch(types.MergePatchType, mark)); err != nil {
				return err
			}
			// A refused delete is sent again marked anew: from this version.
			base = marked.GetResourceVersion()
			del := *do
			del.Preconditions = &metav1.Preconditions{ResourceVersion: &base}
			if do.Preconditions != nil {
				del.Preconditions.UID = do.Preconditions.UID
			}
			return g.Client.Delete(ctx, obj, &del)
		})
		// Written by somebody else between the read and the mark, or the
		// mark and the delete: read again, unless the caller asked for
		// one version. (A guard refusal answers 409 too, which client-go
		// counts as a conflict: it is not one.)
		if !apierrors.IsConflict(err) || IsRefused(err) || want != "" || try == maxResends {
			return err
		}
	}
}

// DeleteAllOf deletes objects of an unguarded kind. Guarded objects are
// deleted one by one, each marked under the guard first: use Delete.
func (g *Client) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	if ok, err := g.guardedKind("delete", obj); err != nil || !ok {
		if err != nil {
			return err
		}
		return g.Client.DeleteAllOf(ctx, obj, opts...)
	}
	return fmt.Errorf("queen-locks guard: DeleteAllOf of a guarded kind is not sent: each guarded object must be marked deletable under the guard first; delete them one by one with Delete")
}

// guarded tells whether a write of obj must carry the guard: it is of a
// guarded kind, and labelled guarded as sent or as stored (the write then
// takes it out of the fence). The stored object is read only when the
// object as sent is not labelled.
func (g *Client) guarded(ctx context.Context, verb string, obj client.Object) (bool, error) {
	if ok, err := g.guardedKind(verb, obj); err != nil || !ok {
		return false, err
	}
	if obj.GetLabels()[permit.GuardedLabel] == "true" {
		return true, nil
	}
	stored, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		return false, fmt.Errorf("queen-locks guard: %T is not a client.Object", obj)
	}
	switch err := g.Client.Get(ctx, client.ObjectKeyFromObject(obj), stored); {
	case apierrors.IsNotFound(err):
		return false, nil // the write answers not found itself
	case err != nil:
		return false, fmt.Errorf("queen-locks guard: reading %s to tell whether it is guarded: %w", objName(obj), err)
	}
	return stored.GetLabels()[permit.GuardedLabel] == "true", nil
}

// guardedPatch is a patch with the guard annotation added as it is sent.
type guardedPatch struct {
	client.Patch
	fence Fence
}

func (p guardedPatch) Data(obj client.Object) ([]byte, error) {
	data, err := p.Patch.Data(obj)
	if err != nil {
		return nil, err
	}
	switch p.Type() {
	case types.MergePatchType, types.StrategicMergePatchType:
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			return nil, fmt.Errorf("queen-locks guard: the patch is not a JSON object: %w", err)
		}
		if m == nil {
			m = map[string]any{}
		}
		meta, _ := m["metadata"].(map[string]any)
		if meta == nil {
			meta = map[string]any{}
		}
		ann, _ := meta["annotations"].(map[string]any)
		if ann == nil {
			ann = map[string]any{}
		}
		ann[permit.GuardAnnotation] = p.fence.Annotation()
		meta["annotations"], m["metadata"] = ann, meta
		return json.Marshal(m)
	case types.JSONPatchType:
		var ops []map[string]any
		if err := json.Unmarshal(data, &ops); err != nil {
			return nil, fmt.Errorf("queen-locks guard: the JSON patch is not a list of operations: %w", err)
		}
		ops = append(ops, map[string]any{"op": "add",
			"path": "/metadata/annotations/" + jsonPointerEscape(permit.GuardAnnotation), "value": p.fence.Annotation()})
		return json.Marshal(ops)
	}
	return nil, fmt.Errorf("queen-locks guard: a %s patch cannot carry the guard", p.Type())
}

// with is m and key=value, in a new map: the caller's map is left as it was.
func with(m map[string]string, key, value string) map[string]string {
	out := maps.Clone(m)
	if out == nil {
		out = map[string]string{}
	}
	out[key] = value
	return out
}

func jsonPointerEscape(s string) string { return strings.NewReplacer("~", "~0", "/", "~1").Replace(s) }
