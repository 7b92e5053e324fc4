package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// releaseRequest names the permit of a row and the token the viewer saw.
type releaseRequest struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Token     string `json:"token"`
}

// Reasons of a release's answer.
const (
	releasedOK      = "released"
	releaseChanged  = "changed"   // renewed or taken over since the viewer saw it: not deleted
	releaseGone     = "gone"      // released or expired already
	releaseRefused  = "forbidden" // the API server refused the caller
	releaseFailed   = "error"     // the API server did not answer
	releaseBadInput = "invalid"
)

type releaseAnswer struct {
	Released bool   `json:"released"`
	Reason   string `json:"reason"`
	Message  string `json:"message,omitempty"`
	// Current is the permit as it is now, when it changed.
	Current *permitRow `json:"current,omitempty"`
}

// release deletes one permit with the caller's identity and a
// precondition on the token the viewer saw: a permit renewed or taken over
// since is not deleted. The API server decides whether the caller may; the
// button the page shows only where a review said yes is a convenience,
// not the check.
func (s *Server) release(w http.ResponseWriter, r *http.Request) {
	answer := func(code int, a releaseAnswer) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(a)
	}
	// A JSON body cannot be sent across origins without a preflight,
	// which this server never answers yes to.
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		answer(http.StatusUnsupportedMediaType, releaseAnswer{Reason: releaseBadInput, Message: "the body must be application/json"})
		return
	}
	var req releaseRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		answer(http.StatusBadRequest, releaseAnswer{Reason: releaseBadInput, Message: "reading the body: " + err.Error()})
		return
	}
	if msg := s.checkRelease(req); msg != "" {
		answer(http.StatusBadRequest, releaseAnswer{Reason: releaseBadInput, Message: msg})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	permits := s.clients.dyn.Resource(queenlocksGVR).Namespace(req.Namespace)
	err := permits.Delete(ctx, req.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &req.Token}})
	switch {
	case err == nil:
		answer(http.StatusOK, releaseAnswer{Released: true, Reason: releasedOK})
	case apierrors.IsConflict(err):
		a := releaseAnswer{Reason: releaseChanged,
			Message: fmt.Sprintf("permit %s changed since token %s was shown (renewed or taken over): it was not released", req.Name, req.Token)}
		if u, gerr := permits.Get(ctx, req.Name, metav1.GetOptions{}); gerr == nil {
			var p locksv1alpha1.QueenLock
			if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p) == nil {
				a.Current = newPermitRow(&p)
			}
		} else if apierrors.IsNotFound(gerr) {
			a = releaseAnswer{Reason: releaseGone, Message: fmt.Sprintf("permit %s is gone already: released or expired", req.Name)}
		}
		answer(http.StatusOK, a)
	case apierrors.IsNotFound(err):
		answer(http.StatusOK, releaseAnswer{Reason: releaseGone, Message: fmt.Sprintf("permit %s is gone already: released or expired", req.Name)})
	case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
		answer(http.StatusForbidden, releaseAnswer{Reason: releaseRefused, Message: "the Kubernetes API refused: " + err.Error()})
	default:
		answer(http.StatusBadGateway, releaseAnswer{Reason: releaseFailed, Message: "the Kubernetes API did not release it: " + err.Error()})
	}
}

// checkRelease answers what is wrong with a release request, or "".
func (s *Server) checkRelease(req releaseRequest) string {
	if errs := validation.IsDNS1123Label(req.Namespace); len(errs) > 0 {
		return fmt.Sprintf("namespace %q: %s", req.Namespace, errs[0])
	}
	if s.hub.scope != "" && req.Namespace != s.hub.scope {
		return fmt.Sprintf("namespace %q is not the one this page shows (%q)", req.Namespace, s.hub.scope)
	}
	if errs := validation.IsDNS1123Subdomain(req.Name); len(errs) > 0 {
		return fmt.Sprintf("name %q: %s", req.Name, errs[0])
	}
	if _, err := permit.Token(req.Token); err != nil {
		return fmt.Sprintf("token %q: %v", req.Token, err)
	}
	return ""
}
