package route

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"

	"github.com/queen-locks/queen-locks/permit"
)

// FuzzDecode feeds the decoder arbitrary bodies: it must never panic, and a
// body it accepts must satisfy every limit of the contract.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"operations":[{"op":"acquire","name":"daily-report","ttlSeconds":30,"owner":"cron-7","limit":1}]}`,
		`{"namespace":"team-a","operations":[{"op":"renew","name":"x","slot":0,"token":90101,"owner":"o","ttlSeconds":30}]}`,
		`{"operations":[{"op":"release","name":"x","token":1},{"op":"get","name":"y"},{"op":"check","name":"z","expect":2}]}`,
		`{"operations":[{"op":"acquire","name":"a#b","ttlSeconds":1.5}]}`,
		`{"operations":[{"op":"acquire","name":"x","ttlSeconds":"30"}]}`,
		`{"operations":null}`, `[]`, `{`, ``, `{"operations":[{}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, bad := Decode(body)
		if (req == nil) == (bad == nil) {
			t.Fatalf("Decode answered %v and %v", req, bad)
		}
		if bad != nil {
			if bad.Message == "" {
				t.Fatal("a refusal without a message")
			}
			return
		}
		if n := len(req.Operations); n < 1 || n > permit.MaxOperations {
			t.Fatalf("accepted %d operations", n)
		}
		names, slots := map[string]bool{}, 0
		for _, op := range req.Operations {
			if permit.ValidateName(op.Name) != nil || names[op.Name] {
				t.Fatalf("accepted name %q", op.Name)
			}
			names[op.Name] = true
			slots += op.Limit
			if op.Op == OpAcquire && permit.ValidateTTL(op.TTLSeconds) != nil {
				t.Fatalf("accepted ttl %d", op.TTLSeconds)
			}
			if op.Limit < 1 || op.Limit > permit.MaxLimit || op.Slot < 0 || op.Slot >= permit.MaxLimit {
				t.Fatalf("accepted limit %d slot %d", op.Limit, op.Slot)
			}
		}
		if slots > permit.MaxSlotsPerCall {
			t.Fatalf("accepted %d slots", slots)
		}
	})
}

// FuzzHandler sends arbitrary bodies through the whole handler, with an API
// server that is not there (nothing listens on loopback port 1): a client's
// mistake must answer 400, and only a well-formed call may reach the API
// server, to get a 503.
func FuzzHandler(f *testing.F) {
	f.Add(`{"operations":[{"op":"get","name":"x"}]}`)
	f.Add(`{"operations":[{"op":"acquire","name":"x","ttlSeconds":0}]}`)
	f.Add(`{"operations":"x"}`)
	scheme := runtime.NewScheme()
	if err := locksv1alpha1.AddToScheme(scheme); err != nil {
		f.Fatal(err)
	}
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(locksv1alpha1.GroupVersion.WithKind("QueenLock"), meta.RESTScopeNamespace)
	srv, err := New(Config{Addr: "127.0.0.1:0", Auth: AuthNone, DefaultNamespace: "default", REST: &rest.Config{Host: "http://127.0.0.1:1"},
		Scheme: scheme, Mapper: mapper, Log: logr.Discard(), OpTimeout: time.Second})
	if err != nil {
		f.Fatal(err)
	}
	h := srv.Handler()
	f.Fuzz(func(t *testing.T, body string) {
		rec := httptest.NewRecorder()
		// A loopback Host: without token auth, any other is refused first.
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "http://127.0.0.1"+Path, strings.NewReader(body)))
		_, bad := Decode([]byte(body))
		switch {
		case bad != nil && rec.Code != http.StatusBadRequest:
			t.Fatalf("malformed call answered %d: %s", rec.Code, rec.Body)
		case bad == nil && rec.Code != http.StatusServiceUnavailable:
			t.Fatalf("well-formed call with no API server answered %d: %s", rec.Code, rec.Body)
		}
	})
}
