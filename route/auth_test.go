package route_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

func installRoles(t *testing.T) {
	t.Helper()
	applyFile(t, "config/rbac/holder_role.yaml")
	applyFile(t, "config/rbac/viewer_role.yaml")
}

func body(ns string, ops ...string) string {
	b := `{"operations":[` + strings.Join(ops, ",") + `]`
	if ns != "" {
		b += `,"namespace":"` + ns + `"`
	}
	return b + "}"
}

func errorOf(t *testing.T, out J) J {
	t.Helper()
	e, ok := out["error"].(J)
	if !ok {
		t.Fatalf("no error object in %v", out)
	}
	return e
}

func TestTokenAuth(t *testing.T) {
	installRoles(t)
	a, b := namespace(t), namespace(t)
	holder := serviceAccount(t, a, "worker", "queen-locks-holder")
	viewer := serviceAccount(t, a, "dashboard", "queen-locks-viewer")
	nobody := serviceAccount(t, a, "nobody", "")

	t.Run("no token is 401", func(t *testing.T) {
		code, out := call(t, tokenURL, "", body(a, acquire("x", "o", 30, 0)))
		if code != http.StatusUnauthorized || num(t, errorOf(t, out)["code"]) != 401 {
			t.Fatalf("answered %d: %v", code, out)
		}
	})
	t.Run("a bad token is 401", func(t *testing.T) {
		code, out := call(t, tokenURL, "not-a-token", body(a, acquire("x", "o", 30, 0)))
		if code != http.StatusUnauthorized {
			t.Fatalf("answered %d: %v", code, out)
		}
	})
	t.Run("a holder acquires in its own namespace, named by its token", func(t *testing.T) {
		code, out := call(t, tokenURL, holder, body("", acquire("job", "w", 30, 0)))
		if code != http.StatusOK {
			t.Fatalf("answered %d: %v", code, out)
		}
		r := out["results"].([]any)[0].(J)
		if r["acquired"] != true || r["guard"].(J)["namespace"] != a {
			t.Fatalf("result %v, want acquired in %s", r, a)
		}
		if ps := permits(t, a); len(ps) != 1 || ps[0].Spec.Owner != "w" {
			t.Fatalf("permits in %s: %v", a, ps)
		}
		tok := num(t, r["token"])
		code, out = call(t, tokenURL, holder, body(a,
			fmt.Sprintf(`{"op":"renew","name":"job","token":%d,"owner":"w"}`, tok)))
		r = out["results"].([]any)[0].(J)
		if code != http.StatusOK || r["renewed"] != true {
			t.Fatalf("renew answered %d: %v", code, out)
		}
		code, out = call(t, tokenURL, holder, body(a,
			fmt.Sprintf(`{"op":"release","name":"job","token":%d,"owner":"w"}`, num(t, r["token"]))))
		if code != http.StatusOK || out["results"].([]any)[0].(J)["released"] != true {
			t.Fatalf("release answered %d: %v", code, out)
		}
	})
	t.Run("a holder in one namespace cannot touch another", func(t *testing.T) {
		code, out := call(t, tokenURL, holder, body(b, acquire("job", "w", 30, 0)))
		if code != http.StatusForbidden || !strings.Contains(errorOf(t, out)["message"].(string), "forbidden") {
			t.Fatalf("answered %d: %v", code, out)
		}
		if ps := permits(t, b); len(ps) != 0 {
			t.Fatalf("wrote in %s: %v", b, ps)
		}
	})
	t.Run("a viewer reads but cannot acquire", func(t *testing.T) {
		code, out := call(t, tokenURL, viewer, body(a, `{"op":"get","name":"job"}`))
		if code != http.StatusOK {
			t.Fatalf("get answered %d: %v", code, out)
		}
		code, out = call(t, tokenURL, viewer, body(a, acquire("job2", "v", 30, 0)))
		if code != http.StatusForbidden {
			t.Fatalf("acquire answered %d: %v", code, out)
		}
	})
	t.Run("a ServiceAccount without rights is 403", func(t *testing.T) {
		code, out := call(t, tokenURL, nobody, body("", `{"op":"get","name":"job"}`))
		if code != http.StatusForbidden {
			t.Fatalf("answered %d: %v", code, out)
		}
	})
}

func TestQuotaStopsAcquiresPastIt(t *testing.T) {
	installRoles(t)
	ns := namespace(t)
	quota := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "locks"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{
			"count/queenlocks.locks.queen.dev": resource.MustParse("2"),
		}},
	}
	if err := env.Client.Create(context.Background(), quota); err != nil {
		t.Fatal(err)
	}
	// The quota controller is not running here; without it the API server
	// refuses every create until status.hard is filled in, so fill it in as
	// the controller would.
	quota.Status = corev1.ResourceQuotaStatus{Hard: quota.Spec.Hard, Used: corev1.ResourceList{"count/queenlocks.locks.queen.dev": resource.MustParse("0")}}
	if err := env.Client.Status().Update(context.Background(), quota); err != nil {
		t.Fatal(err)
	}
	holder := serviceAccount(t, ns, "worker", "queen-locks-holder")
	for i := range 2 {
		code, out := call(t, tokenURL, holder, body("", acquire(fmt.Sprint("l", i), "w", 30, 0)))
		if code != http.StatusOK || out["results"].([]any)[0].(J)["acquired"] != true {
			t.Fatalf("acquire %d within the quota answered %d: %v", i, code, out)
		}
	}
	code, out := call(t, tokenURL, holder, body("", acquire("l2", "w", 30, 0)))
	if code != http.StatusForbidden || !strings.Contains(errorOf(t, out)["message"].(string), "exceeded quota") {
		t.Fatalf("acquire past the quota answered %d: %v", code, out)
	}
	if n := len(permits(t, ns)); n != 2 {
		t.Fatalf("%d permits, want 2", n)
	}
}

func TestAPIServerNotAnsweringIs503(t *testing.T) {
	url, err := serveWith(&rest.Config{Host: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	code, out := call(t, url, "", body("default", acquire("x", "o", 30, 0)))
	e := errorOf(t, out)
	if code != http.StatusServiceUnavailable || !strings.Contains(e["message"].(string), "send the same call again") {
		t.Fatalf("answered %d: %v", code, out)
	}
}
