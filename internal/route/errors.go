package route

import (
	"encoding/json"
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/queen-locks/queen-locks/routeapi"
)

// callError is an answer other than 200 to a whole call.
type callError = routeapi.Error

// classify maps an error from the API server to the call's answer. The
// error itself goes to the log: its text can name the API server's address
// and the webhook's, which are none of the caller's business.
func classify(i int, op string, err error) *callError {
	if apierrors.IsNotFound(err) {
		// Only a namespace can be missing here: a missing permit is an answer.
		return &callError{Code: http.StatusBadRequest, Field: "namespace", Index: &i,
			Message: fmt.Sprintf("operations[%d] (%s): the namespace does not exist", i, op)}
	}
	if apierrors.IsInvalid(err) {
		// The webhook or the CRD's rules refused what the route wrote, for a
		// reason other than held or lost (those are answers): a fault of
		// queen-locks, not an outage.
		return &callError{Code: http.StatusInternalServerError, Index: &i,
			Message: fmt.Sprintf("operations[%d] (%s): the admission webhook refused the route's write; see the manager's log", i, op)}
	}
	why := "the API server did not carry it out"
	switch reason := apierrors.ReasonForError(err); {
	case apierrors.IsInternalError(err), apierrors.IsTimeout(err), apierrors.IsServerTimeout(err), apierrors.IsServiceUnavailable(err):
		// A webhook that does not answer (failurePolicy Fail) comes back as
		// an internal error; which of the two failed is in the log.
		why = "the API server or its admission webhook did not answer"
	case reason != metav1.StatusReasonUnknown:
		why += " (" + string(reason) + ")"
	}
	return &callError{Code: http.StatusServiceUnavailable, Index: &i,
		Message: fmt.Sprintf("operations[%d] (%s): %s; some operations may have applied: send the same call again with the same owners", i, op, why)}
}

// rank orders the answers of a failed call: a namespace that does not exist
// is the caller's to fix, and worth saying over an outage.
func rank(code int) int {
	if code == http.StatusBadRequest {
		return 1
	}
	return 0
}

func writeError(w http.ResponseWriter, e callError) int {
	// A refused call does not keep its connection: a caller that only
	// sends what is refused (no token, a bad one, the wrong method) must
	// connect again for each try, and cannot sit on connections.
	w.Header().Set("Connection", "close")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Code)
	_ = json.NewEncoder(w).Encode(routeapi.ErrorResponse{Error: e})
	return e.Code
}
