package route_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/internal/testcert"
)

// writeCert writes a certificate for 127.0.0.1 into dir as tls.crt and
// tls.key, each replaced whole, from a CA of its own, and answers that CA:
// a client trusting one certificate's CA does not trust the next.
func writeCert(t *testing.T, dir string) *testcert.CA {
	t.Helper()
	ca, err := testcert.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteServing(dir, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	return ca
}

// The route serves TLS from a directory, and takes a renewed certificate
// without a restart.
func TestTLSAndARenewedCertificate(t *testing.T) {
	dir := t.TempDir()
	first := writeCert(t, dir)
	url, stop, err := env.StartRouteConfig(route.Config{Auth: route.AuthNone, DefaultNamespace: namespace(t), TLSCertDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if !strings.HasPrefix(url, "https://") {
		t.Fatalf("url %s", url)
	}
	get := func(c *http.Client) (int, error) {
		resp, err := c.Post(url, "application/json", strings.NewReader(`{"operations":[{"op":"get","name":"tls"}]}`))
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := get(first.Client()); err != nil || code != http.StatusOK {
		t.Fatalf("over TLS: %d %v", code, err)
	}
	if _, err := get(http.DefaultClient); err == nil {
		t.Fatal("a client that does not trust the certificate got through")
	}
	second := writeCert(t, dir)
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		code, err := get(second.Client())
		return err == nil && code == http.StatusOK, nil
	})
	if err != nil {
		t.Fatal("the route did not take the renewed certificate")
	}
	if _, err := get(first.Client()); err == nil {
		t.Fatal("the route still serves the first certificate")
	}

	if _, err := route.New(route.Config{Auth: route.AuthNone, Addr: "127.0.0.1:0", DefaultNamespace: "default", REST: env.Config,
		Scheme: env.Client.Scheme(), Mapper: env.Client.RESTMapper(), TLSCertDir: t.TempDir()}); err == nil ||
		!strings.Contains(err.Error(), "--route-tls-cert-dir") {
		t.Fatalf("an empty certificate directory: %v", err)
	}
}
