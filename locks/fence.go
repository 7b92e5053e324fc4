package locks

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// DefaultGuardedResources are the kinds the guard webhook fences unless the
// installation names others (the chart's guard.rules).
var DefaultGuardedResources = []schema.GroupVersionResource{
	{Version: "v1", Resource: "configmaps"},
	{Version: "v1", Resource: "secrets"},
}

// Fence raises the fence records of the objects bound to a slot, so that a
// write of an earlier holding that was admitted but not yet stored is
// refused when kube-apiserver runs admission again inside its
// compare-and-swap. Every acquire runs it before it answers (see WithFence
// and the permit webhook).
//
// It finds the objects in the slot's QueenLockFence, which the guard
// webhook keeps (Enroll), and patches their metadata only, with the
// manager's identity: the guard webhook admits a raise from the manager
// alone, without a guard, and only ever raises a record.
type Fence struct {
	// Client reads and writes QueenLockFences; it must read from the API
	// server, not a cache.
	Client client.Client
	// Meta patches the bound objects' metadata and reads it to drop
	// entries whose objects are gone.
	Meta metadata.Interface
	// Resources are the guarded kinds: DefaultGuardedResources when nil,
	// none when empty (an installation without the guard webhook).
	Resources []schema.GroupVersionResource
}

func (f *Fence) resources() []schema.GroupVersionResource {
	if f.Resources == nil {
		return DefaultGuardedResources
	}
	return f.Resources
}

// Kinds are the guarded kinds the fence raises objects of.
func (f *Fence) Kinds() []schema.GroupVersionResource { return f.resources() }

// Bound reads the objects bound to slot of lock in ns: the slot's
// QueenLockFence, read from the API server with a GET, which kube-apiserver
// serves from etcd at its current revision (never a cache, and no wait for
// a watch cache to catch up): an object whose binding was stored before the
// acquire's permit is in it, since the guard webhook adds it here before
// it admits the write that binds it. Only entries of guarded kinds are
// answered. A slot nothing was ever bound to has no QueenLockFence: one
// read that answers 404.
func (f *Fence) Bound(ctx context.Context, ns, lock string, slot int) ([]locksv1alpha1.FencedObject, error) {
	var fc locksv1alpha1.QueenLockFence
	err := f.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: permit.Name(lock, slot)}, &fc)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading the objects bound to lock %q slot %d: %w", lock, slot, err)
	case fc.Spec.Lock != lock || int(fc.Spec.Slot) != slot:
		return nil, nil // another lock's fence under a colliding name cannot happen: permit names are unique per lock and slot
	}
	guarded := map[schema.GroupResource]bool{}
	for _, gvr := range f.resources() {
		guarded[gvr.GroupResource()] = true
	}
	var out []locksv1alpha1.FencedObject
	for _, o := range fc.Spec.Objects {
		// A kind no longer guarded is not sent to the guard webhook: a raise
		// annotation sent to it would be stored as it is.
		if guarded[schema.GroupResource{Group: o.Group, Resource: o.Resource}] {
			out = append(out, o)
		}
	}
	return out, nil
}

// Raise raises the record of every object bound to slot of lock in ns to
// floor: every token below it is refused from then on, at the next write
// and at any write kube-apiserver has admitted but not stored yet. floor
// must be no higher than any token the slot can still hand out: the first
// token of the holding that won the slot, or a version at which the slot
// was seen free. It answers how many bound objects took the raise.
//
// Each object gets one JSON patch, applied by kube-apiserver to the object
// as stored: it tests that the object is still labelled guarded (an object
// taken out of the fence is not sent to the guard webhook, which removes
// the raise annotation) and adds the raise annotation, which the guard
// webhook turns into the record when the stored record is of this lock and
// slot and below floor, and removes otherwise. A raise that changes
// nothing stores nothing, so a raise repeated (an acquire answered
// already) writes no new version.
func (f *Fence) Raise(ctx context.Context, ns, lock string, slot int, floor uint64) (int, error) {
	objs, err := f.Bound(ctx, ns, lock, slot)
	if err != nil || len(objs) == 0 {
		return 0, err
	}
	raise := permit.Guard{Lock: lock, Slot: slot, Token: floor}.String()
	body, _ := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/labels/" + jsonPointerEscape(permit.GuardedLabel), "value": "true"},
		{"op": "add", "path": "/metadata/annotations/" + jsonPointerEscape(permit.RaiseAnnotation), "value": raise},
	})
	raised := 0
	for _, o := range objs {
		gvr := schema.GroupVersionResource{Group: o.Group, Version: o.Version, Resource: o.Resource}
		_, err := f.Meta.Resource(gvr).Namespace(ns).Patch(ctx, o.Name, types.JSONPatchType, body, metav1.PatchOptions{})
		switch {
		case err == nil:
			raised++
		case apierrors.IsNotFound(err), apierrors.IsInvalid(err):
			// Gone, or no longer guarded or bound (the patch's test, or its
			// add to annotations that are not there, failed): nothing of an
			// earlier holder can be stored to it through the fence.
		default:
			return raised, fmt.Errorf("raising the fence of %s %s/%s to %s: %w", gvr.GroupResource(), ns, o.Name, raise, err)
		}
	}
	return raised, nil
}

// jsonPointerEscape escapes a map key for a JSON pointer (RFC 6901).
func jsonPointerEscape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// WithFence makes every acquire that wins (or answers already) raise the
// fence of the slot's bound objects before it answers: the manager's
// acquires, which skip the permit webhook, where the raise of the others
// happens.
func WithFence(f *Fence) Option { return func(l *Client) { l.fence = f } }

// raise runs the fence's raise for an acquire that won, to the holding's
// first token.
func (l *Client) raise(ctx context.Context, ns, lock string, a Acquired) (Acquired, error) {
	if l.fence == nil || !a.Acquired || a.Floor == 0 {
		return a, nil
	}
	if _, err := l.fence.Raise(ctx, ns, lock, a.Slot, a.Floor); err != nil {
		// The slot is held but its objects may still take an earlier
		// holder's write: no acquired answer. The same acquire sent again
		// answers already and raises again.
		return Acquired{}, fmt.Errorf("acquired slot %d of lock %q, but %w", a.Slot, lock, err)
	}
	return a, nil
}

// StaleAfter is how long an entry of a QueenLockFence is kept after the
// write that bound its object was reviewed, even when the object cannot be
// found bound to the slot: kube-apiserver may hold an admitted write until
// its request deadline (60 s by default) before it stores it, and an entry
// dropped meanwhile would hide the object from every later raise.
const StaleAfter = 2 * time.Minute

// SlotFullError refuses a binding to a slot that has permit.MaxBoundPerSlot
// objects already.
type SlotFullError struct {
	Namespace, Lock string
	Slot, Bound     int
}

func (e *SlotFullError) Error() string {
	return fmt.Sprintf("lock %q slot %d already has %d objects bound to it in namespace %s, the most one slot may have (every acquire of the slot raises the fence of each before it answers): bind this object to another lock, or take one out of the fence",
		e.Lock, e.Slot, e.Bound, e.Namespace)
}

// Enroll makes sure obj is in the QueenLockFence of slot of lock in ns
// before the write that binds it (or writes it bound) is admitted: the
// guard webhook calls it for every guarded write. binding says the write
// binds the object anew (a create, an opt-in, a rebinding after the
// override): its entry's since is set to now, so that it is not dropped
// while that write may still be on its way to storage. A write of an
// object already bound and enrolled reads the fence and writes nothing.
//
// A slot holds at most permit.MaxBoundPerSlot entries; when it is full,
// entries whose objects are gone or no longer bound to the slot, and
// whose since is older than StaleAfter, are dropped first, then the
// binding is refused with a *SlotFullError. Every change is conditional on
// the version read, so two bindings at once cannot both pass the cap.
func (f *Fence) Enroll(ctx context.Context, ns, lock string, slot int, obj locksv1alpha1.FencedObject, binding bool, now time.Time) error {
	obj.Since = metav1.NewMicroTime(now)
	key := client.ObjectKey{Namespace: ns, Name: permit.Name(lock, slot)}
	for try := 0; try < DefaultTries*2; try++ {
		var fc locksv1alpha1.QueenLockFence
		err := f.Client.Get(ctx, key, &fc)
		if apierrors.IsNotFound(err) {
			fc = locksv1alpha1.QueenLockFence{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name, Labels: map[string]string{permit.LockLabel: permit.LabelValue(lock)}},
				Spec:       locksv1alpha1.QueenLockFenceSpec{Lock: lock, Slot: int32(slot), Objects: []locksv1alpha1.FencedObject{obj}},
			}
			err = f.Client.Create(ctx, &fc)
			switch {
			case err == nil:
				return nil
			case apierrors.IsAlreadyExists(err):
				continue
			}
			return fmt.Errorf("recording %s %s/%s as bound to lock %q slot %d: %w", obj.Resource, ns, obj.Name, lock, slot, err)
		}
		if err != nil {
			return fmt.Errorf("reading the objects bound to lock %q slot %d: %w", lock, slot, err)
		}
		i := entry(fc.Spec.Objects, obj)
		switch {
		case i >= 0 && !binding:
			return nil
		case i >= 0:
			fc.Spec.Objects[i].Version, fc.Spec.Objects[i].Since = obj.Version, obj.Since
		default:
			if len(fc.Spec.Objects) >= permit.MaxBoundPerSlot {
				kept, err := f.live(ctx, ns, lock, slot, fc.Spec.Objects, now)
				if err != nil {
					return err
				}
				if len(kept) >= permit.MaxBoundPerSlot {
					return &SlotFullError{Namespace: ns, Lock: lock, Slot: slot, Bound: len(kept)}
				}
				fc.Spec.Objects = kept
			}
			fc.Spec.Objects = append(fc.Spec.Objects, obj)
		}
		err = f.Client.Update(ctx, &fc)
		switch {
		case err == nil:
			return nil
		case apierrors.IsConflict(err):
			continue
		}
		return fmt.Errorf("recording %s %s/%s as bound to lock %q slot %d: %w", obj.Resource, ns, obj.Name, lock, slot, err)
	}
	return fmt.Errorf("recording %s %s/%s as bound to lock %q slot %d: the slot's fence kept changing", obj.Resource, ns, obj.Name, lock, slot)
}

// entry finds obj among objs by kind and name (not version: the same
// object may be written at another version of its API).
func entry(objs []locksv1alpha1.FencedObject, obj locksv1alpha1.FencedObject) int {
	for i, o := range objs {
		if o.Group == obj.Group && o.Resource == obj.Resource && o.Name == obj.Name {
			return i
		}
	}
	return -1
}

// live answers the entries to keep: those whose object is bound to the
// slot now, and those too recent to tell (StaleAfter).
func (f *Fence) live(ctx context.Context, ns, lock string, slot int, objs []locksv1alpha1.FencedObject, now time.Time) ([]locksv1alpha1.FencedObject, error) {
	var kept []locksv1alpha1.FencedObject
	for _, o := range objs {
		if now.Sub(o.Since.Time) < StaleAfter {
			kept = append(kept, o)
			continue
		}
		gvr := schema.GroupVersionResource{Group: o.Group, Version: o.Version, Resource: o.Resource}
		m, err := f.Meta.Resource(gvr).Namespace(ns).Get(ctx, o.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("reading %s %s/%s, bound to lock %q slot %d: %w", gvr.GroupResource(), ns, o.Name, lock, slot, err)
		}
		rec, bound, perr := permit.ParseFence(m.Annotations[permit.FenceAnnotation])
		if perr == nil && bound && rec.Lock == lock && rec.Slot == slot && m.Labels[permit.GuardedLabel] == "true" {
			kept = append(kept, o)
		}
	}
	return kept, nil
}
