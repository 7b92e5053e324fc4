package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// Paths of the guard webhooks; config/webhook/guard.yaml names the same.
const (
	GuardMutatePath   = "/mutate-guarded"
	GuardValidatePath = "/validate-guarded"
)

// Guard fences writes to opted-in objects (ConfigMaps and Secrets by
// default) with a lock's token. A write that carries the guard annotation
// is admitted only while that permit is held with exactly that token, and
// never with a token below the highest the object has recorded.
//
// The second rule is what closes the race in the first: the read of the
// permit and the write of the object are two steps, but the recorded fence
// is compared with the object as stored, inside the API server's own
// compare-and-swap of that object. Once a newer holder has written, no
// older one ever can.
type Guard struct {
	// Reader must read from the API server, not a cache.
	Reader client.Reader
	Clock  clock.PassiveClock
}

// SetupWithManager registers both guard webhooks.
func (g *Guard) SetupWithManager(mgr ctrl.Manager) {
	if g.Clock == nil {
		g.Clock = clock.RealClock{}
	}
	if g.Reader == nil {
		g.Reader = mgr.GetAPIReader()
	}
	srv := mgr.GetWebhookServer()
	srv.Register(GuardMutatePath, &admission.Webhook{Handler: admission.HandlerFunc(g.Mutate)})
	srv.Register(GuardValidatePath, &admission.Webhook{Handler: admission.HandlerFunc(g.Validate)})
}

type objectMeta struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
}

// writeMetas decodes the metadata of the object a create or update writes,
// and of the object it replaces (empty on create). For any other operation,
// or a body that does not decode, ok is false and resp is the answer.
func writeMetas(req admission.Request) (obj, old metav1.ObjectMeta, resp admission.Response, ok bool) {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return obj, old, admission.Allowed(""), false
	}
	var err error
	if obj, err = decodeMeta(req.Object.Raw); err == nil {
		old, err = decodeMeta(req.OldObject.Raw)
	}
	if err != nil {
		return obj, old, admission.Errored(http.StatusBadRequest, err), false
	}
	return obj, old, resp, true
}

func decodeMeta(raw []byte) (metav1.ObjectMeta, error) {
	var o objectMeta
	if len(raw) == 0 {
		return o.Metadata, nil
	}
	err := json.Unmarshal(raw, &o)
	return o.Metadata, err
}

// Mutate records the guard's token as the object's fence.
func (g *Guard) Mutate(ctx context.Context, req admission.Request) admission.Response {
	meta, _, resp, ok := writeMetas(req)
	if !ok {
		return resp
	}
	raw, ok := meta.Annotations[permit.GuardAnnotation]
	if !ok {
		return admission.Allowed("")
	}
	guard, err := permit.ParseGuard(raw)
	if err != nil {
		return guardDenied(raw, fmt.Sprintf("annotation %s: %v", permit.GuardAnnotation, err))
	}
	return admission.Patched("recorded the fence", jsonpatch.JsonPatchOperation{
		Operation: "add",
		Path:      pointer("metadata", "annotations", permit.FenceAnnotation),
		Value:     strconv.FormatUint(guard.Token, 10),
	})
}

// Validate admits a guarded write only under the current token.
func (g *Guard) Validate(ctx context.Context, req admission.Request) admission.Response {
	meta, old, resp, ok := writeMetas(req)
	if !ok {
		return resp
	}
	highest, err := fenceOf(old)
	if err != nil {
		return guardDenied("", err.Error())
	}
	raw, ok := meta.Annotations[permit.GuardAnnotation]
	if !ok {
		if highest > 0 {
			return guardDenied("", fmt.Sprintf("this object has accepted writes under token %d; every write to it needs the annotation %s: <lock>#<slot>=<token>", highest, permit.GuardAnnotation))
		}
		return admission.Allowed("")
	}
	guard, err := permit.ParseGuard(raw)
	if err != nil {
		return guardDenied(raw, fmt.Sprintf("annotation %s: %v", permit.GuardAnnotation, err))
	}
	if guard.Token < highest {
		return guardDenied(raw, fmt.Sprintf("token %d is below %d, the highest this object has accepted: a newer holder of the lock has written it", guard.Token, highest))
	}
	if meta.Annotations[permit.FenceAnnotation] != strconv.FormatUint(guard.Token, 10) {
		return guardDenied(raw, fmt.Sprintf("annotation %s is recorded by the webhook and must equal the guard's token", permit.FenceAnnotation))
	}
	ns := req.Namespace
	var p locksv1alpha1.QueenLock
	err = g.Reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: permit.Name(guard.Lock, guard.Slot)}, &p)
	switch {
	case apierrors.IsNotFound(err):
		return guardDenied(raw, fmt.Sprintf("lock %q slot %d is free in namespace %s: nobody holds it", guard.Lock, guard.Slot, ns))
	case err != nil:
		return admission.Errored(http.StatusServiceUnavailable, fmt.Errorf("reading the permit of lock %q: %w", guard.Lock, err))
	}
	current, err := permit.Token(p.ResourceVersion)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	switch {
	case p.Spec.Lock != guard.Lock:
		return guardDenied(raw, fmt.Sprintf("lock %q slot %d is free in namespace %s", guard.Lock, guard.Slot, ns))
	case permit.Expired(&p, g.Clock.Now()):
		return guardDenied(raw, fmt.Sprintf("lock %q slot %d expired at %s", guard.Lock, guard.Slot, permit.FormatTime(p.Spec.ExpireTime.Time)))
	case current != guard.Token:
		return guardDenied(raw, fmt.Sprintf("lock %q slot %d is held with token %d, not %d", guard.Lock, guard.Slot, current, guard.Token))
	}
	return admission.Allowed("")
}

func fenceOf(meta metav1.ObjectMeta) (uint64, error) {
	raw, ok := meta.Annotations[permit.FenceAnnotation]
	if !ok {
		return 0, nil
	}
	t, err := permit.Token(raw)
	if err != nil {
		return 0, fmt.Errorf("the stored annotation %s is damaged (%q); restore it or recreate the object", permit.FenceAnnotation, raw)
	}
	return t, nil
}

// pointer is the JSON pointer (RFC 6901) to the member named by keys, for a
// patch: "~" and "/" inside a key, as in a label or annotation name, are
// escaped.
func pointer(keys ...string) string {
	var b strings.Builder
	for _, k := range keys {
		b.WriteString("/")
		b.WriteString(pointerEscape.Replace(k))
	}
	return b.String()
}

var pointerEscape = strings.NewReplacer("~", "~0", "/", "~1")

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
