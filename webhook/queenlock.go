// Package webhook holds the admission webhooks that make every write to a
// QueenLock a valid lock transition, whoever sends it: the route, a handle,
// kubectl or a raw API call.
package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// MutatePath is where the webhook is served; config/webhook names the same.
const MutatePath = "/mutate-locks-queen-dev-v1alpha1-queenlock"

// The re-check after every mutating webhook has run is not a second
// webhook: it is the CRD's own CEL rules (see api/v1alpha1), evaluated inside
// the API server without another network round trip per write.
//
// +kubebuilder:webhook:path=/mutate-locks-queen-dev-v1alpha1-queenlock,mutating=true,failurePolicy=fail,sideEffects=NoneOnDryRun,groups=locks.queen.dev,resources=queenlocks,verbs=create;update,versions=v1alpha1,name=mqueenlock.locks.queen.dev,admissionReviewVersions=v1,timeoutSeconds=10

// QueenLock admits writes to permits. Clock is the server's clock: the times
// it stamps are the only ones the lock trusts.
type QueenLock struct {
	Clock clock.PassiveClock
	// Grace is the clock skew tolerated between replicas: a takeover is
	// admitted only once a permit expired more than Grace ago, so a replica
	// whose clock runs ahead does not hand a lock over early. The expiry
	// controller waits the same.
	Grace time.Duration
	// Self is the manager's own username. The route writes permits with
	// the manager's identity after verifying the caller, and names the
	// caller's pod as the holder: the manager may name any pod. Set by
	// SetupWithManager from a SelfSubjectReview when empty.
	Self string
	// Fence raises the fence of a slot's bound objects before an acquire
	// that did not come from the manager is admitted (the manager raises
	// its own after it wins); nil raises nothing.
	Fence *locks.Fence
	// Reader reads the stored permit a takeover names before its fence is
	// raised; it must read from the API server, not a cache. Set by
	// SetupWithManager when nil.
	Reader  client.Reader
	decoder admission.Decoder
}

// SetupWithManager registers the webhook on the manager's webhook server.
func (h *QueenLock) SetupWithManager(mgr ctrl.Manager) error {
	if h.Clock == nil {
		h.Clock = clock.RealClock{}
	}
	if h.Self == "" {
		self, err := WhoAmI(mgr.GetConfig())
		if err != nil {
			return err
		}
		h.Self = self
	}
	if h.Reader == nil {
		h.Reader = mgr.GetAPIReader()
	}
	h.decoder = admission.NewDecoder(mgr.GetScheme())
	srv := mgr.GetWebhookServer()
	srv.Register(MutatePath, &admission.Webhook{Handler: admission.HandlerFunc(h.Mutate)})
	return nil
}

// WhoAmI asks the API server whose credential cfg is: the user name the
// webhook configuration's matchConditions and the admission policies
// compare with the manager's.
func WhoAmI(cfg *rest.Config) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", fmt.Errorf("creating a client to learn the manager's own identity: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("learning the manager's own identity (SelfSubjectReview): %w", err)
	}
	return r.Status.UserInfo.Username, nil
}

// Mutate decides the transition and stamps the server's times on it.
func (h *QueenLock) Mutate(ctx context.Context, req admission.Request) admission.Response {
	old, obj, resp := h.decode(req)
	if obj == nil {
		return resp
	}
	if old != nil && old.DeletionTimestamp != nil && !slices.Equal(old.Finalizers, obj.Finalizers) && !h.finishesDeletes(req) {
		return admission.Denied(fmt.Sprintf("permit %s of lock %q is being deleted: only the queen-locks manager removes its finalizers, "+
			"with an update; a patch that empties them lets kube-apiserver delete whatever permit has the name by then, "+
			"which may be the next holder's", old.Name, old.Spec.Lock))
	}
	sent := sentFields{labels: obj.Labels != nil, label: obj.Labels[permit.LockLabel], dropManagedFields: dropManagedFields(old, obj),
		firstToken: obj.Spec.FirstToken, holderPodNamespace: holderPodNamespace(obj)}
	caller := callerOf(req)
	caller.Manager = req.UserInfo.Username == h.Self // the route, writing for a caller it verified
	if !caller.Manager {
		if errs := permit.ValidateMetadata(obj.Labels, obj.Annotations); len(errs) > 0 {
			return deny(&permit.Refusal{Errs: errs}, obj.Name)
		}
	}
	stamped, err := permit.Stamp(old, obj, h.Clock.Now(), h.Grace, caller)
	if err != nil {
		return deny(err, obj.Name)
	}
	// A dry run raises nothing: the webhook declares no side effects on
	// dry runs (sideEffects=NoneOnDryRun), and a dry run wins nothing.
	if stamped && !caller.Manager && h.Fence != nil && (req.DryRun == nil || !*req.DryRun) {
		if resp, ok := h.raise(ctx, req, old, obj, caller); !ok {
			return resp
		}
	}
	if !stamped {
		if sent.dropManagedFields {
			// A write to a permit being deleted that changes nothing but
			// managedFields then changes nothing at all, and is not stored.
			return admission.Patched("", removeManagedFields)
		}
		return admission.Allowed("")
	}
	return admission.Patched("", stampPatch(sent, obj)...)
}

// raise raises the fence of the slot an acquire from outside the manager
// takes (a raw create, the handles' and CLI's direct transport), before
// the acquire is admitted and so before its writer can learn that it won.
// The new token is not known yet, so the floor is one the slot cannot
// have handed out to an earlier holding and will not hand out again:
//   - a takeover: the expired permit's token + 1. The takeover is
//     conditional on that version, and every later token is higher. The
//     review's old object is not trusted for it: where kube-apiserver
//     presents no client certificate, any pod can post a review of its own
//     making, and the raise is the one thing a review makes the manager
//     write. The stored permit is read from the API server and must be
//     the version the review names and expired by the same judgement, so
//     a forged review cannot fence a live holding out of its objects.
//   - a create: a version at which the permit was read absent, read from
//     the API server now. Every earlier holding was gone by then, so its
//     tokens are lower, and any create that wins after it has a higher
//     token. A create that finds the permit present is refused as lost
//     here (it would be refused as AlreadyExists anyway): were it admitted
//     unraised and the holder released meanwhile, it would win unraised.
//     Two creates racing for a free slot both read it absent before
//     either was stored, so the loser's floor is below the winner's token.
func (h *QueenLock) raise(ctx context.Context, req admission.Request, old, obj *locksv1alpha1.QueenLock, caller permit.Caller) (admission.Response, bool) {
	var floor uint64
	switch {
	case old == nil:
		l, err := h.Fence.Meta.Resource(locksv1alpha1.GroupVersion.WithResource("queenlocks")).Namespace(req.Namespace).
			List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + obj.Name})
		if err != nil {
			return admission.Errored(http.StatusServiceUnavailable, fmt.Errorf("reading permit %s before raising the fence of its objects: %w", obj.Name, err)), false
		}
		if len(l.Items) > 0 {
			return deny(&permit.Refusal{Reason: permit.ReasonHeld, Errs: field.ErrorList{field.Invalid(field.NewPath("metadata", "name"), obj.Name,
				"the permit exists: this slot of the lock is held (or being released); read it to learn by whom")}}, obj.Name), false
		}
		if floor, err = permit.Token(l.ResourceVersion); err != nil {
			return admission.Errored(http.StatusInternalServerError, err), false
		}
	case !obj.Spec.AcquireTime.Equal(old.Spec.AcquireTime): // a takeover
		tok, resp, ok := h.storedTakeover(ctx, req, old, caller)
		if !ok {
			return resp, false
		}
		floor = tok + 1
	default:
		return admission.Response{}, true // a renew
	}
	if _, err := h.Fence.Raise(ctx, req.Namespace, obj.Spec.Lock, int(obj.Spec.Slot), floor); err != nil {
		return admission.Errored(http.StatusServiceUnavailable, err), false
	}
	return admission.Response{}, true
}

// storedTakeover reads the permit a takeover names from the API server
// and judges the takeover again against it, answering its token. A review
// kube-apiserver sends carries the stored version as its old object, so
// the two agree; one that does not is refused, changing nothing.
func (h *QueenLock) storedTakeover(ctx context.Context, req admission.Request, old *locksv1alpha1.QueenLock, caller permit.Caller) (uint64, admission.Response, bool) {
	stored := &locksv1alpha1.QueenLock{}
	err := h.Reader.Get(ctx, client.ObjectKeyFromObject(old), stored)
	switch {
	case apierrors.IsNotFound(err):
		return 0, admission.Errored(http.StatusConflict, fmt.Errorf("permit %s is no longer stored: read it again", old.Name)), false
	case err != nil:
		return 0, admission.Errored(http.StatusServiceUnavailable, fmt.Errorf("reading permit %s before raising the fence of its objects", old.Name)), false
	case stored.ResourceVersion != old.ResourceVersion || stored.UID != old.UID:
		return 0, admission.Errored(http.StatusConflict, fmt.Errorf("permit %s changed since this write was sent: read it again", old.Name)), false
	}
	// Judged as sent: Stamp has already changed the decoded object, and
	// only a takeover pays for decoding it again.
	judged := &locksv1alpha1.QueenLock{}
	if err := h.decoder.DecodeRaw(req.Object, judged); err != nil {
		return 0, admission.Errored(http.StatusBadRequest, err), false
	}
	if _, err := permit.Stamp(stored, judged, h.Clock.Now(), h.Grace, caller); err != nil {
		return 0, deny(err, old.Name), false
	}
	if judged.Spec.AcquireTime.Equal(stored.Spec.AcquireTime) {
		// Against the stored permit the write is no takeover (a renew of
		// the holding, say): raising would fence the holding's own token.
		return 0, admission.Errored(http.StatusConflict, fmt.Errorf("permit %s is not what this write was judged against: read it again", old.Name)), false
	}
	tok, err := permit.Token(stored.ResourceVersion)
	if err != nil {
		return 0, admission.Errored(http.StatusInternalServerError, err), false
	}
	return tok, admission.Response{}, true
}

// finishesDeletes is whether req may remove the finalizers of a permit
// being deleted: only when the manager itself sends it, which it does with
// an update (controller.Deletion). When a write empties the finalizers,
// kube-apiserver deletes the object under the name in a second step, with
// the request's preconditions: an update carries the object's UID and so
// deletes only that permit; a patch (the garbage collector's, or
// kubectl's) carries none, and racing the manager's own removal it can
// delete a permit created since under the same name. Admission cannot tell
// a patch from an update (both arrive as UPDATE with UpdateOptions), so the
// rule is by identity. The garbage collector retries a refused patch until
// the permit is gone.
func (h *QueenLock) finishesDeletes(req admission.Request) bool {
	return req.UserInfo.Username == h.Self
}

// sentFields are the parts of a permit that Stamp may change, as the caller
// sent them.
type sentFields struct {
	labels             bool // the object had a labels map
	label              string
	dropManagedFields  bool
	firstToken         int64
	holderPodNamespace string
}

func holderPodNamespace(obj *locksv1alpha1.QueenLock) string {
	if obj.Spec.HolderPod == nil {
		return ""
	}
	return obj.Spec.HolderPod.Namespace
}

var removeManagedFields = jsonpatch.JsonPatchOperation{Operation: "remove", Path: "/metadata/managedFields"}

// dropManagedFields tells whether the webhook removes the managedFields of
// a write (see stampPatch). It keeps them on a permit that somebody
// server-side applies (kubectl apply --server-side, a GitOps tool): without
// its record an applier's next apply, a renew with a new TTL say, would
// conflict with "before-first-apply" over its own fields. A permit being
// deleted keeps none: nothing will apply it again.
func dropManagedFields(old, obj *locksv1alpha1.QueenLock) bool {
	if len(obj.ManagedFields) == 0 {
		return false
	}
	if old != nil && old.DeletionTimestamp != nil {
		return true
	}
	return !slices.ContainsFunc(obj.ManagedFields, func(e metav1.ManagedFieldsEntry) bool {
		return e.Operation == metav1.ManagedFieldsOperationApply
	})
}

// stampPatch is the JSON patch from what the caller sent to what Stamp made
// of it: the lock label and the three times (always written, so they are
// stored in one format whatever the caller sent), and no managedFields
// unless somebody server-side applies the permit (dropManagedFields).
//
// Every field of a permit is the lock's, written by lock transitions only,
// so the record of which client last set which field tells nobody
// anything; but kube-apiserver pays for it on every write and read of a
// permit: it is nearly half the stored object, decoded and re-encoded with
// the rest of the metadata for each request, each watch event and each
// informer. Removing it here stores permits without it, and a later update
// of an object without managedFields skips the field manager altogether
// (it tracks fields again only after a server-side apply). It is written
// out rather than found by serialising the stamped object and diffing it
// with the request, which costs a marshal, two parses and a diff on every
// permit write.
func stampPatch(sent sentFields, obj *locksv1alpha1.QueenLock) []jsonpatch.JsonPatchOperation {
	var ops []jsonpatch.JsonPatchOperation
	add := func(path string, v any) {
		ops = append(ops, jsonpatch.JsonPatchOperation{Operation: "add", Path: path, Value: v})
	}
	switch value := obj.Labels[permit.LockLabel]; {
	case !sent.labels:
		add("/metadata/labels", obj.Labels)
	case sent.label != value:
		add(pointer("metadata", "labels", permit.LockLabel), value)
	}
	if sent.dropManagedFields {
		ops = append(ops, removeManagedFields)
	}
	add("/spec/acquireTime", obj.Spec.AcquireTime)
	add("/spec/renewTime", obj.Spec.RenewTime)
	add("/spec/expireTime", obj.Spec.ExpireTime)
	switch {
	case obj.Spec.FirstToken != 0 && obj.Spec.FirstToken != sent.firstToken:
		add("/spec/firstToken", obj.Spec.FirstToken)
	case obj.Spec.FirstToken == 0 && sent.firstToken != 0:
		ops = append(ops, jsonpatch.JsonPatchOperation{Operation: "remove", Path: "/spec/firstToken"})
	}
	if ns := holderPodNamespace(obj); ns != sent.holderPodNamespace {
		add("/spec/holderPod/namespace", ns)
	}
	return ops
}

// Keys of the user info extra that kube-apiserver fills in for a
// ServiceAccount token bound to a pod.
const (
	podNameExtra = "authentication.kubernetes.io/pod-name"
	podUIDExtra  = "authentication.kubernetes.io/pod-uid"
)

// callerOf is the pod the request's credential is bound to, if any. A
// pod-bound token is a ServiceAccount's, and a pod runs in its
// ServiceAccount's namespace.
func callerOf(req admission.Request) permit.Caller {
	first := func(key string) string {
		if v := req.UserInfo.Extra[key]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	c := permit.Caller{PodName: first(podNameExtra), PodUID: first(podUIDExtra)}
	if c.PodName != "" {
		if ns, _, err := serviceaccount.SplitUsername(req.UserInfo.Username); err == nil {
			c.PodNamespace = ns
		}
	}
	return c
}

func (h *QueenLock) decode(req admission.Request) (old, obj *locksv1alpha1.QueenLock, resp admission.Response) {
	switch req.Operation {
	case admissionv1.Create, admissionv1.Update:
	default:
		return nil, nil, admission.Allowed("")
	}
	obj = &locksv1alpha1.QueenLock{}
	if err := h.decoder.DecodeRaw(req.Object, obj); err != nil {
		return nil, nil, admission.Errored(http.StatusBadRequest, err)
	}
	if req.Operation == admissionv1.Update {
		old = &locksv1alpha1.QueenLock{}
		if err := h.decoder.DecodeRaw(req.OldObject, old); err != nil {
			return nil, nil, admission.Errored(http.StatusBadRequest, err)
		}
	}
	return old, obj, resp
}

// deny turns a refusal of a write to permit name into an admission denial.
// A lost race is a 409 whose Status reason is the contract's reason (held
// or lost), so that callers can tell it from an invalid object, which is a
// 422 naming each field. The name goes into the details, from which kubectl
// writes "The QueenLock "name" is invalid".
func deny(err error, name string) admission.Response {
	var r *permit.Refusal
	if !errors.As(err, &r) {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	status := metav1.Status{
		Status:  metav1.StatusFailure,
		Message: r.Error(),
		Code:    http.StatusUnprocessableEntity,
		Reason:  metav1.StatusReasonInvalid,
		Details: &metav1.StatusDetails{Name: name, Group: locksv1alpha1.GroupVersion.Group, Kind: "QueenLock"},
	}
	if r.Reason != "" {
		status.Code = http.StatusConflict
		status.Reason = metav1.StatusReason(r.Reason)
	}
	for _, e := range r.Errs {
		status.Details.Causes = append(status.Details.Causes, metav1.StatusCause{
			Type: metav1.CauseType(e.Type), Message: e.ErrorBody(), Field: e.Field,
		})
	}
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &status}}
}
