package webhook

import (
	"context"
	"fmt"
	"net/http"

	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// unavailable answers a review whose read of the API server failed. The
// answer never carries the API server's error: anyone who can reach the
// webhook port can send a review naming any object, and an error's text
// (not found, forbidden) would tell them whether it exists. The error goes
// to the manager's log instead.
func unavailable(ctx context.Context, what string, err error) admission.Response {
	log.FromContext(ctx).Error(err, "a review could not be decided", "reading", what)
	return admission.Errored(http.StatusServiceUnavailable, fmt.Errorf("could not read %s from the API server to decide this write; try again (the manager's log has the cause)", what))
}
