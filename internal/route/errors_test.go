package route

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// classify tells errors apart by their API status, never by their text.
func TestClassify(t *testing.T) {
	gr := schema.GroupResource{Group: "locks.queen.dev", Resource: "queenlocks"}
	for _, c := range []struct {
		name string
		err  error
		code int
		says string
	}{
		{"a namespace that does not exist", apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "gone"), http.StatusBadRequest, "namespace does not exist"},
		{"a write the webhook refused as invalid", apierrors.NewInvalid(schema.GroupKind{Group: gr.Group, Kind: "QueenLock"}, "x.0",
			field.ErrorList{field.Invalid(field.NewPath("spec", "owner"), "", "bad")}), http.StatusInternalServerError, "refused the route's write"},
		{"a webhook that did not answer", apierrors.NewInternalError(errors.New(`failed calling webhook "mqueenlock.locks.queen.dev": connection refused`)), http.StatusServiceUnavailable, "admission webhook did not answer"},
		{"a timeout", apierrors.NewTimeoutError("slow", 1), http.StatusServiceUnavailable, "did not answer"},
		{"a conflict", apierrors.NewConflict(gr, "x.0", errors.New("changed")), http.StatusServiceUnavailable, "did not carry it out (Conflict)"},
		{"no API server", errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), http.StatusServiceUnavailable, "did not carry it out;"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := classify(2, "acquire", c.err)
			if e.Code != c.code || !strings.Contains(e.Message, c.says) || !strings.HasPrefix(e.Message, "operations[2] (acquire): ") {
				t.Fatalf("classify = %d %q, want %d saying %q", e.Code, e.Message, c.code, c.says)
			}
			if strings.Contains(e.Message, "127.0.0.1") || strings.Contains(e.Message, "mqueenlock") {
				t.Fatalf("the answer names an address or a webhook: %q", e.Message)
			}
		})
	}
}
