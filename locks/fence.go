package locks

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"

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
// It reads and writes metadata only, with the manager's identity: the
// guard webhook admits a raise from the manager alone, without a guard, and
// only ever raises a record.
type Fence struct {
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

// Bound lists the objects bound to slot of lock in ns, one consistent,
// metadata-only list per guarded kind, selected by permit.SlotLabel. The
// list is read from the API server at its current version (resourceVersion
// unset), never from a cache: an object bound just before is in it.
func (f *Fence) Bound(ctx context.Context, ns, lock string, slot int) ([]BoundObject, error) {
	sel := permit.SlotLabel + "=" + permit.SlotLabelValue(lock, slot)
	var out []BoundObject
	for _, gvr := range f.resources() {
		l, err := f.Meta.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if apierrors.IsNotFound(err) {
			continue // a kind this API server does not serve (a CRD not installed) holds no objects
		}
		if err != nil {
			return nil, fmt.Errorf("listing the %s bound to lock %q slot %d: %w", gvr.Resource, lock, slot, err)
		}
		for i := range l.Items {
			m := &l.Items[i].ObjectMeta
			rec, bound, err := permit.ParseFence(m.Annotations[permit.FenceAnnotation])
			if err != nil || !bound || rec.Lock != lock || rec.Slot != slot || m.Labels[permit.GuardedLabel] != "true" {
				continue // a hash collision, or a label left over by hand: the guard would not see a raise
			}
			out = append(out, BoundObject{Resource: gvr, Name: m.Name, ResourceVersion: m.ResourceVersion, Record: rec.Token})
		}
	}
	return out, nil
}

// BoundObject is one object bound to a slot, as listed.
type BoundObject struct {
	Resource        schema.GroupVersionResource
	Name            string
	ResourceVersion string
	Record          uint64
}

// Raise raises the record of every object bound to slot of lock in ns to
// floor: every token below it is refused from then on, at the next write
// and at any write kube-apiserver has admitted but not stored yet. floor
// must be no higher than any token the slot can still hand out: the first
// token of the holding that won the slot, or a version at which the slot
// was seen free. Records already at floor or above are left as they are,
// so a raise repeated (an acquire answered already) writes nothing. It
// answers how many objects it wrote.
func (f *Fence) Raise(ctx context.Context, ns, lock string, slot int, floor uint64) (int, error) {
	objs, err := f.Bound(ctx, ns, lock, slot)
	if err != nil {
		return 0, err
	}
	raised := 0
	for _, o := range objs {
		n, err := f.raiseOne(ctx, ns, lock, slot, floor, o)
		if err != nil {
			return raised, err
		}
		raised += n
	}
	return raised, nil
}

// raiseOne raises one object's record, conditional on the version it was
// judged at: when the object changed first (its holder wrote it, or an
// administrator took it out of the fence), it is read again and judged
// again.
func (f *Fence) raiseOne(ctx context.Context, ns, lock string, slot int, floor uint64, o BoundObject) (int, error) {
	ri := f.Meta.Resource(o.Resource).Namespace(ns)
	raise := permit.Guard{Lock: lock, Slot: slot, Token: floor}.String()
	for try := 0; try < DefaultTries*2; try++ {
		if o.Record >= floor {
			return 0, nil
		}
		body, _ := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": o.ResourceVersion,
			"annotations":     map[string]string{permit.RaiseAnnotation: raise},
		}})
		_, err := ri.Patch(ctx, o.Name, types.MergePatchType, body, metav1.PatchOptions{})
		switch {
		case err == nil:
			return 1, nil
		case apierrors.IsNotFound(err):
			return 0, nil
		case !apierrors.IsConflict(err): // a guard refusal is a 409 of reason kv_precondition, not Conflict
			return 0, fmt.Errorf("raising the fence of %s %s/%s to %s: %w", o.Resource.Resource, ns, o.Name, raise, err)
		}
		m, err := ri.Get(ctx, o.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return 0, nil
		case err != nil:
			return 0, fmt.Errorf("reading %s %s/%s to raise its fence: %w", o.Resource.Resource, ns, o.Name, err)
		}
		rec, bound, perr := permit.ParseFence(m.Annotations[permit.FenceAnnotation])
		if perr != nil || !bound || rec.Lock != lock || rec.Slot != slot || m.Labels[permit.GuardedLabel] != "true" {
			return 0, nil // out of the fence, or bound elsewhere, since the list
		}
		o.ResourceVersion, o.Record = m.ResourceVersion, rec.Token
	}
	return 0, fmt.Errorf("raising the fence of %s %s/%s to %s: the object kept changing", o.Resource.Resource, ns, o.Name, raise)
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
