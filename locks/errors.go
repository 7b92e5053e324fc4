package locks

import (
	"errors"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/queen-locks/queen-locks/permit"
)

// isLostRace tells whether the admission webhook (or, for the manager, the
// same rules run before the write: see AsManager) refused a write because
// the permit was held or lost, a race the caller lost rather than a
// failure.
func isLostRace(err error) bool {
	var r *permit.Refusal
	if errors.As(err, &r) {
		return r.Reason != ""
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false
	}
	switch string(status.Status().Reason) {
	case permit.ReasonHeld, permit.ReasonLost:
		return true
	}
	return false
}

// isQuota tells whether the ResourceQuota admission refused a create: the
// namespace may hold no more permits. The one error kind told by its text:
// the quota admission answers a plain Forbidden, shaped like an RBAC
// refusal, with no reason or cause of its own to tell them apart.
func isQuota(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota")
}
