package charts

import (
	"context"
	"net/http"
	"strings"
	"testing"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/internal/controlplane"
)

// API Priority and Fairness is opt-in: by default the chart leaves the
// manager in the built-in service-accounts schema.
func TestAPIPriorityOffByDefault(t *testing.T) {
	for key := range render(t) {
		if strings.HasPrefix(key, "FlowSchema/") || strings.HasPrefix(key, "PriorityLevelConfiguration/") {
			t.Errorf("%s rendered with apiPriority.enabled=false", key)
		}
	}
}

// Turned on, a real API server classifies the manager's permit requests
// and its TokenReviews into the chart's level, and nothing else of the
// manager's (its leader election keeps the built-in level).
func TestAPIPriorityClassifiesTheManagersLockTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a control plane")
	}
	ctx := context.Background()
	e, err := controlplane.Start(controlplane.Options{Bare: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Stop() }()
	objs := renderAs(t, "apiPriority.enabled=true", "apiPriority.borrowingLimitPercent=100")
	for _, key := range []string{"PriorityLevelConfiguration/x-queen-locks", "FlowSchema/x-queen-locks"} {
		if err := e.Client.Create(ctx, get(t, objs, key)); err != nil {
			t.Fatalf("the API server refused %s: %v", key, err)
		}
	}
	var fs flowcontrolv1.FlowSchema
	if err := e.Client.Get(ctx, client.ObjectKey{Name: "x-queen-locks"}, &fs); err != nil {
		t.Fatal(err)
	}
	var pl flowcontrolv1.PriorityLevelConfiguration
	if err := e.Client.Get(ctx, client.ObjectKey{Name: "x-queen-locks"}, &pl); err != nil {
		t.Fatal(err)
	}
	if b := pl.Spec.Limited.BorrowingLimitPercent; b == nil || *b != 100 {
		t.Errorf("borrowingLimitPercent %v, want 100", b)
	}
	// The manager may do anything here: what is checked is where its
	// requests are classified, not what they are allowed.
	if err := e.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "manager-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "x-queen-locks", Namespace: "team"}},
	}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:team:x-queen-locks",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:team", "system:authenticated"}}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	schemaOf := func(method, path, body string) string {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, cfg.Host+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.Header.Get("X-Kubernetes-PF-FlowSchema-UID")
	}
	ours := string(fs.UID)
	for _, c := range []struct{ what, method, path, body string }{
		{"listing permits", "GET", "/apis/locks.queen.dev/v1alpha1/namespaces/other/queenlocks", ""},
		{"watching permits in every namespace", "GET", "/apis/locks.queen.dev/v1alpha1/queenlocks?watch=true&timeoutSeconds=1", ""},
		{"a TokenReview", "POST", "/apis/authentication.k8s.io/v1/tokenreviews",
			`{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":"x"}}`},
	} {
		if got := schemaOf(c.method, c.path, c.body); got != ours {
			t.Errorf("%s: classified by FlowSchema %q, want the chart's %q", c.what, got, ours)
		}
	}
	for _, c := range []struct{ what, method, path string }{
		{"reading pods", "GET", "/api/v1/namespaces/other/pods"},
		{"reading its Lease", "GET", "/apis/coordination.k8s.io/v1/namespaces/team/leases/x"},
	} {
		if got := schemaOf(c.method, c.path, ""); got == "" || got == ours {
			t.Errorf("%s: classified by FlowSchema %q, want a built-in one", c.what, got)
		}
	}
}
