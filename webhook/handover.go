package webhook

import (
	"context"
	"fmt"
	"net/http"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// judgeHandover admits a handover from outside the manager (a direct
// client's release, kubectl) only to the head of the lock's line that can
// use the slot, with exactly what that waiter asked (permit.JudgeHandover):
// a handover to anyone else would let its writer pass the line. The line
// and the lock's permits are read from the API server, never a cache: a
// waiter that just joined or left decides who is at the head. The fence
// is raised after, as for any takeover (raise).
func (h *QueenLock) judgeHandover(ctx context.Context, req admission.Request, old, obj *locksv1alpha1.QueenLock) (admission.Response, bool) {
	sel := client.MatchingLabels{permit.LockLabel: permit.LabelValue(obj.Spec.Lock)}
	var ws locksv1alpha1.QueenLockWaiterList
	if err := h.Reader.List(ctx, &ws, client.InNamespace(req.Namespace), sel); err != nil {
		return admission.Errored(http.StatusServiceUnavailable, fmt.Errorf("reading the line of lock %q to judge a handover: %w", obj.Spec.Lock, err)), false
	}
	var ps locksv1alpha1.QueenLockList
	if err := h.Reader.List(ctx, &ps, client.InNamespace(req.Namespace), sel); err != nil {
		return admission.Errored(http.StatusServiceUnavailable, fmt.Errorf("reading the permits of lock %q to judge a handover: %w", obj.Spec.Lock, err)), false
	}
	head := locks.HeadFor(ws.Items, ps.Items, old, h.Clock.Now())
	if err := permit.JudgeHandover(obj, head); err != nil {
		return deny(err, obj.Name), false
	}
	return admission.Response{}, true
}
