package manager_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/queen-locks/queen-locks/internal/controlplane"
)

// The metrics name namespaces and callers: they are served over HTTPS to
// callers the API server says may get /metrics, and to nobody else.
func TestMetricsNeedAuthenticationAndAuthorization(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	env, err := controlplane.Start(controlplane.Options{MetricsAddr: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	if err := env.ApplyFile("config/rbac/metrics_reader_role.yaml"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := env.Namespace(t, "metrics")
	token := func(name string, reader bool) string {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if err := env.Client.Create(ctx, sa); err != nil {
			t.Fatal(err)
		}
		if reader {
			crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "queen-locks-metrics-reader"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}}
			if err := env.Client.Create(ctx, crb); err != nil {
				t.Fatal(err)
			}
		}
		p := env.Pod(t, ns, name, name)
		return env.PodToken(t, p)
	}
	scraper, nobody := token("scraper", true), token("nobody", false)
	// The certificate is self-signed: this test checks who may read, not
	// whom to trust.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	scrape := func(tok string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, "https://"+addr+"/metrics", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// The endpoint starts with the manager; wait until it answers at all.
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		code, _ := scrape("")
		return code != 0, nil
	}); err != nil {
		t.Fatal("the metrics endpoint never answered over HTTPS")
	}
	if code, body := scrape(""); code != http.StatusUnauthorized {
		t.Fatalf("no token: %d %q, want 401", code, body)
	}
	if code, body := scrape(nobody); code != http.StatusForbidden {
		t.Fatalf("a ServiceAccount without the metrics reader role: %d %q, want 403", code, body)
	}
	code, body := scrape(scraper)
	if code != http.StatusOK || !strings.Contains(body, "queen_locks_") {
		t.Fatalf("the metrics reader: %d, want 200 with queen_locks_ metrics; body starts %.200q", code, body)
	}
	plain, err := http.Get("http://" + addr + "/metrics")
	if err == nil {
		plain.Body.Close()
		if plain.StatusCode == http.StatusOK {
			t.Fatal("metrics answered over plain HTTP")
		}
	}
}
