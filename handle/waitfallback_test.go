package handle_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/queen-locks/queen-locks/handle"
)

// A route from before waitSeconds refuses the field with a 400 that names
// it in field; the handle then polls, and sends waitSeconds no more. A 400
// whose message merely mentions waitSeconds, with another field, is an
// error like any other. (A pure unit test of the transport's reading of
// the route's answer: the route's own answer is tested in internal/route.)
func TestAcquireWaitingFallsBackByField(t *testing.T) {
	for _, tc := range []struct {
		field    string
		fallback bool
	}{
		{field: "waitSeconds", fallback: true},
		{field: "ttlSeconds", fallback: false},
	} {
		t.Run(tc.field, func(t *testing.T) {
			calls := 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls++
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
					"code": 400, "index": 0, "field": tc.field,
					"message": "unknown field for acquire (not waitSeconds-aware)"}})
			}))
			defer srv.Close()
			tr := handle.HTTP(srv.URL+"/api/v1/locks", handle.HTTPOptions{Token: "x"})
			wt, ok := tr.(handle.WaitingTransport)
			if !ok {
				t.Fatal("the HTTP transport cannot wait")
			}
			_, waited, err := wt.AcquireWaiting(context.Background(), "l", "o", 10, 1, 5*time.Second)
			if tc.fallback {
				if err != nil || waited {
					t.Fatalf("waited=%v err=%v, want a fallback to polling", waited, err)
				}
				if _, waited, _ = wt.AcquireWaiting(context.Background(), "l", "o", 10, 1, 5*time.Second); waited || calls != 1 {
					t.Fatalf("after the fallback: waited=%v, %d calls, want no second call with waitSeconds", waited, calls)
				}
				return
			}
			var ce *handle.CallError
			if !waited || err == nil || !errors.As(err, &ce) || ce.Field != tc.field {
				t.Fatalf("waited=%v err=%v, want the route's 400 naming %s", waited, err, tc.field)
			}
		})
	}
}
