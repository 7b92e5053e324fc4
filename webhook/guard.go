package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// Paths of the guard webhooks; config/webhook/guard.yaml names the same.
const (
	GuardMutatePath   = "/mutate-guarded"
	GuardValidatePath = "/validate-guarded"
)

// The right an administrator needs for the documented override: the verb
// "override" on guards.locks.queen.dev in the object's namespace.
const (
	OverrideVerb     = "override"
	OverrideResource = "guards"
)

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Guard fences writes to opted-in objects (ConfigMaps and Secrets by
// default) with a lock's token.
//
// The mutating webhook decides every create and update: the write must
// carry its own guard annotation, naming the lock and slot the object is
// bound to (the first guarded write binds it) with a token no lower than the
// object's record and held right now. It then stores the guard as the
// record and removes the guard itself, so nothing a later write leaves out
// is ever judged by an earlier writer's guard.
//
// The read of the permit and the write of the object are two steps, but the
// record is compared with the object as stored, inside the API server's own
// compare-and-swap of that object (admission runs again when the swap
// loses). Once a newer holder has written, no older one ever can.
//
// The validating webhook re-checks the stored result (nothing after us may
// have changed the record) and decides deletes, which carry no annotations:
// a delete is admitted while the holder that marked the object deletable
// still holds the lock, while the namespace is being deleted, or for an
// administrator with the override right.
type Guard struct {
	// Reader must read from the API server, not a cache.
	Reader client.Reader
	// Client creates SubjectAccessReviews for the override.
	Client client.Client
	Clock  clock.PassiveClock
	// Self is the manager's own username: the only writer whose raise
	// (permit.RaiseAnnotation) is admitted. Set by SetupWithManager from a
	// SelfSubjectReview when empty.
	Self string
	// Fence records every object a guarded write stores bound to a slot
	// in the slot's QueenLockFence, before the write is admitted, and caps
	// them; nil records nothing (and no acquire could raise them).
	Fence *locks.Fence
}

// SetupWithManager registers both guard webhooks.
func (g *Guard) SetupWithManager(mgr ctrl.Manager) error {
	if g.Clock == nil {
		g.Clock = clock.RealClock{}
	}
	if g.Self == "" {
		self, err := WhoAmI(mgr.GetConfig())
		if err != nil {
			return err
		}
		g.Self = self
	}
	if g.Reader == nil {
		g.Reader = mgr.GetAPIReader()
	}
	if g.Client == nil {
		g.Client = mgr.GetClient()
	}
	srv := mgr.GetWebhookServer()
	srv.Register(GuardMutatePath, &admission.Webhook{Handler: admission.HandlerFunc(g.Mutate)})
	srv.Register(GuardValidatePath, &admission.Webhook{Handler: admission.HandlerFunc(g.Validate)})
	return nil
}

type objectMeta struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
}

// metas decodes the metadata of the object a request writes (empty on
// delete) and of the stored object it replaces or deletes (empty on create).
func metas(req admission.Request) (obj, old metav1.ObjectMeta, err error) {
	if obj, err = decodeMeta(req.Object.Raw); err == nil {
		old, err = decodeMeta(req.OldObject.Raw)
	}
	return obj, old, err
}

func decodeMeta(raw []byte) (metav1.ObjectMeta, error) {
	var o objectMeta
	if len(raw) == 0 {
		return o.Metadata, nil
	}
	err := json.Unmarshal(raw, &o)
	return o.Metadata, err
}

func isGuarded(m metav1.ObjectMeta) bool { return m.Labels[permit.GuardedLabel] == "true" }

// Mutate admits a create or update of a guarded object only under its own
// current guard, and turns that guard into the object's record.
func (g *Guard) Mutate(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	meta, old, err := metas(req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if raw, ok := meta.Annotations[permit.RaiseAnnotation]; ok {
		return g.raise(req, meta, old, raw)
	}
	guarded, wasGuarded := isGuarded(meta), isGuarded(old)
	if !guarded && !wasGuarded {
		return admission.Allowed("")
	}
	if _, ok := meta.Annotations[permit.OverrideAnnotation]; ok {
		if resp, ok := g.override(ctx, req); !ok {
			return resp
		}
		// The override takes the object out of the fence, record and all:
		// a guarded write opts it in again and binds it anew, to whichever
		// lock it names.
		ops := removeAnnotations(meta, permit.OverrideAnnotation,
			permit.GuardAnnotation, permit.FenceAnnotation, permit.DeletableAnnotation)
		ops = append(ops, removeLabels(meta, permit.GuardedLabel, permit.SlotLabel)...)
		return admission.Patched("override", ops...)
	}
	raw, ok := meta.Annotations[permit.GuardAnnotation]
	if !ok {
		return guardDenied("", fmt.Sprintf("every write to an object labelled %s=true needs its own annotation %s: <lock>#<slot>=<token>, held now",
			permit.GuardedLabel, permit.GuardAnnotation))
	}
	if !wasGuarded && old.Annotations[permit.GuardAnnotation] == raw {
		// No webhook saw the object while it was unguarded, so its stored
		// annotations may be anybody's: a guard kept from then is not this
		// write's own.
		return guardDenied(raw, fmt.Sprintf("the object already carried this guard before it opted in, so this write may not have sent it: remove the annotation %s, then opt in with a write that sends it", permit.GuardAnnotation))
	}
	guard, err := permit.ParseGuard(raw)
	if err != nil {
		return guardDenied(raw, fmt.Sprintf("annotation %s: %v", permit.GuardAnnotation, err))
	}
	if wasGuarded {
		if why := bindingRefusal(old, guard); why != "" {
			return guardDenied(raw, why)
		}
	}
	if resp, ok := g.current(ctx, req.Namespace, raw, guard); !ok {
		return resp
	}
	if !guarded {
		// The holder takes the object out of the fence: no record is left
		// behind to bind it when it opts in again.
		return admission.Patched("left the fence", append(removeAnnotations(meta,
			permit.GuardAnnotation, permit.FenceAnnotation, permit.DeletableAnnotation),
			removeLabels(meta, permit.SlotLabel)...)...)
	}
	ops := removeAnnotations(meta, permit.GuardAnnotation)
	ops = append(ops, setAnnotation(meta, permit.FenceAnnotation, guard.String()))
	// The label every acquire of the slot finds the object by: set at
	// every guarded write, so that no write can leave it out or change it.
	if slot := permit.SlotLabelValue(guard.Lock, guard.Slot); meta.Labels[permit.SlotLabel] != slot {
		ops = append(ops, jsonpatch.JsonPatchOperation{Operation: "add", Path: pointer("metadata", "labels", permit.SlotLabel), Value: slot})
	}
	if mark, ok := meta.Annotations[permit.DeletableAnnotation]; ok {
		switch {
		case !wasGuarded && mark == old.Annotations[permit.DeletableAnnotation]:
			// Planted while no webhook looked: not this write's mark.
			ops = append(ops, removeAnnotations(meta, permit.DeletableAnnotation)...)
		case mark == "true":
			ops = append(ops, setAnnotation(meta, permit.DeletableAnnotation, fmt.Sprint(guard.Token)))
		case mark != old.Annotations[permit.DeletableAnnotation]:
			return guardDenied(raw, fmt.Sprintf(`annotation %s: set it to "true" to mark the object deletable under this write's guard`, permit.DeletableAnnotation))
		}
	}
	return admission.Patched("recorded the fence", ops...)
}

// raise admits the manager's raise of an object's record (locks.Fence),
// without a guard: it only ever raises the record of the lock and slot the
// stored object is bound to, decided here against the object as stored,
// inside kube-apiserver's compare-and-swap. The deletable mark goes with
// it: it was written under a token the raise refuses.
func (g *Guard) raise(req admission.Request, meta, old metav1.ObjectMeta, raw string) admission.Response {
	if req.UserInfo.Username != g.Self || req.Operation != admissionv1.Update {
		return guardDenied("", fmt.Sprintf("annotation %s: only the queen-locks manager raises a fence record, on an update", permit.RaiseAnnotation))
	}
	floor, err := permit.ParseGuard(raw)
	if err != nil {
		return guardDenied("", fmt.Sprintf("annotation %s: %v", permit.RaiseAnnotation, err))
	}
	ops := append(removeAnnotations(meta, permit.RaiseAnnotation), keepManagedFields(meta, old)...)
	rec, bound, err := permit.ParseFence(old.Annotations[permit.FenceAnnotation])
	if !isGuarded(old) || err != nil || !bound || rec.Lock != floor.Lock || rec.Slot != floor.Slot || floor.Token <= rec.Token {
		return admission.Patched("nothing to raise", ops...)
	}
	ops = append(ops, setAnnotation(meta, permit.FenceAnnotation, floor.String()))
	ops = append(ops, removeAnnotations(meta, permit.DeletableAnnotation)...)
	return admission.Patched("raised the fence", ops...)
}

// keepManagedFields sets the written object's managedFields back to the
// stored object's. kube-apiserver records the manager as the owner of the
// raise annotation before the webhooks run; kept, that entry would make
// every raise a new version, even one that raises nothing (a repeat
// acquire), and would list the manager among the object's writers for an
// annotation that is never stored.
func keepManagedFields(meta, old metav1.ObjectMeta) []jsonpatch.JsonPatchOperation {
	switch {
	case len(old.ManagedFields) > 0:
		return []jsonpatch.JsonPatchOperation{{Operation: "add", Path: "/metadata/managedFields", Value: old.ManagedFields}}
	case len(meta.ManagedFields) > 0:
		return []jsonpatch.JsonPatchOperation{{Operation: "remove", Path: "/metadata/managedFields"}}
	}
	return nil
}

// boundTo tells whether the stored object is already bound to guard's
// lock and slot.
func boundTo(old metav1.ObjectMeta, guard permit.Guard) bool {
	rec, bound, err := permit.ParseFence(old.Annotations[permit.FenceAnnotation])
	return isGuarded(old) && err == nil && bound && rec.Lock == guard.Lock && rec.Slot == guard.Slot
}

// enroll records the object a guarded write stores as bound to its slot
// in the slot's QueenLockFence (locks.Fence.Enroll), before the write is
// admitted, so that every acquire of the slot finds it and raises its
// record: the binding write itself, and every later one too (an object
// bound before QueenLockFences existed is recorded at its next write). A
// write past the slot's cap is refused. A dry run records nothing.
func (g *Guard) enroll(ctx context.Context, req admission.Request, meta, old metav1.ObjectMeta, rec permit.Guard) admission.Response {
	if g.Fence == nil {
		return admission.Allowed("")
	}
	name := meta.Name
	if name == "" {
		name = req.Name
	}
	if name == "" {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("a guarded %s with no name", req.Resource.Resource))
	}
	obj := locksv1alpha1.FencedObject{Group: req.Resource.Group, Version: req.Resource.Version, Resource: req.Resource.Resource, Name: name}
	binding := !boundTo(old, rec)
	if req.DryRun != nil && *req.DryRun {
		// No side effect on a dry run: whether the slot has room is what it
		// would be told.
		objs, err := g.Fence.Bound(ctx, req.Namespace, rec.Lock, rec.Slot)
		if err != nil {
			return unavailable(ctx, fmt.Sprintf("the objects bound to lock %q", rec.Lock), err)
		}
		if binding && len(objs) >= permit.MaxBoundPerSlot {
			return guardDenied(rec.String(), (&locks.SlotFullError{Namespace: req.Namespace, Lock: rec.Lock, Slot: rec.Slot, Bound: len(objs)}).Error())
		}
		return admission.Allowed("")
	}
	err := g.Fence.Enroll(ctx, req.Namespace, rec.Lock, rec.Slot, obj, binding, g.Clock.Now())
	var full *locks.SlotFullError
	switch {
	case errors.As(err, &full):
		return guardDenied(rec.String(), full.Error())
	case err != nil:
		return unavailable(ctx, fmt.Sprintf("the objects bound to lock %q", rec.Lock), err)
	}
	return admission.Allowed("")
}

// bindingRefusal says why guard may not write an object whose stored
// metadata is old, or "" when it may: the guard must name the lock and
// slot the object is bound to, with a token no lower than its record.
func bindingRefusal(old metav1.ObjectMeta, guard permit.Guard) string {
	raw, ok := old.Annotations[permit.FenceAnnotation]
	if !ok {
		return ""
	}
	rec, bound, err := permit.ParseFence(raw)
	switch {
	case err != nil:
		return fmt.Sprintf("the stored record %s=%q is damaged; an administrator can reset it with the override (docs/fencing.md)", permit.FenceAnnotation, raw)
	case bound && (rec.Lock != guard.Lock || rec.Slot != guard.Slot):
		return fmt.Sprintf("this object is bound to lock %q slot %d; a guard of another lock or slot cannot write it", rec.Lock, rec.Slot)
	case guard.Token < rec.Token:
		// The record may be a later holder's token: never name it.
		return fmt.Sprintf("token %d is below the highest token this object has accepted: a newer holder of the lock has written it", guard.Token)
	}
	return ""
}

// current admits guard only while its permit in ns is held with exactly its
// token, read from the API server.
func (g *Guard) current(ctx context.Context, ns, raw string, guard permit.Guard) (admission.Response, bool) {
	var p locksv1alpha1.QueenLock
	err := g.Reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: permit.Name(guard.Lock, guard.Slot)}, &p)
	switch {
	case apierrors.IsNotFound(err):
		return guardDenied(raw, fmt.Sprintf("lock %q slot %d is free in namespace %s: nobody holds it", guard.Lock, guard.Slot, ns)), false
	case err != nil:
		return unavailable(ctx, fmt.Sprintf("the permit of lock %q", guard.Lock), err), false
	}
	current, err := permit.Token(p.ResourceVersion)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err), false
	}
	switch {
	case p.Spec.Lock != guard.Lock || p.DeletionTimestamp != nil:
		return guardDenied(raw, fmt.Sprintf("lock %q slot %d is free in namespace %s", guard.Lock, guard.Slot, ns)), false
	case permit.Expired(&p, g.Clock.Now()):
		return guardDenied(raw, fmt.Sprintf("lock %q slot %d expired at %s", guard.Lock, guard.Slot, permit.FormatTime(p.Spec.ExpireTime.Time))), false
	case current != guard.Token:
		// Another holder's token, or a later one of the same holding, is
		// never told: whoever may send a write would learn a guard.
		return guardDenied(raw, fmt.Sprintf("lock %q slot %d is not held with token %d any more", guard.Lock, guard.Slot, guard.Token)), false
	}
	return admission.Response{}, true
}

// Validate re-checks what Mutate stored and decides deletes.
func (g *Guard) Validate(ctx context.Context, req admission.Request) admission.Response {
	meta, old, err := metas(req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	switch req.Operation {
	case admissionv1.Delete:
		return g.validateDelete(ctx, req, old)
	case admissionv1.Create, admissionv1.Update:
	default:
		return admission.Allowed("")
	}
	if !isGuarded(meta) {
		return admission.Allowed("")
	}
	if raw, ok := meta.Annotations[permit.GuardAnnotation]; ok {
		return guardDenied(raw, "the guard annotation was not removed before storing: is the mutating guard webhook installed?")
	}
	raw, ok := meta.Annotations[permit.FenceAnnotation]
	if !ok {
		return guardDenied("", fmt.Sprintf("a guarded object must carry the record %s, which the mutating guard webhook sets from each write's guard", permit.FenceAnnotation))
	}
	rec, bound, err := permit.ParseFence(raw)
	if err != nil || !bound {
		return guardDenied("", fmt.Sprintf("the record %s=%q does not name a lock", permit.FenceAnnotation, raw))
	}
	if isGuarded(old) {
		if why := bindingRefusal(old, rec); why != "" {
			return guardDenied(raw, why)
		}
	}
	if req.UserInfo.Username == g.Self && boundTo(old, rec) {
		// The manager's raise of a bound object's record: the object is in
		// the slot's fence already (the raise found it there).
		return admission.Allowed("")
	}
	return g.enroll(ctx, req, meta, old, rec)
}

// guardDenied refuses a guarded write with reason kv_precondition, naming
// the guard's lock when there is one.
func guardDenied(guard, why string) admission.Response {
	msg := "kv_precondition: " + why
	if g, err := permit.ParseGuard(guard); err == nil {
		msg = fmt.Sprintf("kv_precondition: lock %q (guard %s): %s", g.Lock, guard, why)
	} else if guard != "" {
		msg = fmt.Sprintf("kv_precondition: guard %q: %s", guard, why)
	}
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusConflict, Reason: "kv_precondition", Message: msg,
	}}}
}
