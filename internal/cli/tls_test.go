package cli_test

import (
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/queen-locks/queen-locks/internal/testcert"
)

// tlsRoute serves the real route of ns behind a TLS-terminating reverse
// proxy with a certificate for 127.0.0.1, made by a CA of this test. It
// answers the proxy's base URL, the CA's PEM, and the Authorization headers
// the proxy has seen so far.
func tlsRoute(t *testing.T, ns string) (base string, caPEM []byte, auths func() []string) {
	t.Helper()
	ca, err := testcert.New()
	if err != nil {
		t.Fatal(err)
	}
	target, err := url.Parse(startRoute(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	var mu sync.Mutex
	var seen []string
	srv, err := ca.StartServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv.URL, ca.PEM, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

func TestRouteOverTLS(t *testing.T) {
	ns := namespace(t)
	base, caPEM, auths := tlsRoute(t, ns)
	dir := t.TempDir()
	caFile, tokenFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "token")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokenFile, []byte("projected-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ql := func(envs []string, args ...string) (int, string, string) {
		c := exec.Command(queenlock, args...)
		c.Env = append(os.Environ(), append([]string{"QUEEN_LOCKS_URL=", "QUEEN_LOCKS_CA_FILE=", "QUEEN_LOCKS_TOKEN_FILE="}, envs...)...)
		var stdout, stderr strings.Builder
		c.Stdout, c.Stderr = &stdout, &stderr
		return exitCode(c.Run()), stdout.String(), stderr.String()
	}

	code, out, errOut := ql(nil, "acquire", "tls", "--server", base, "--ca-file", caFile, "--ttl", "30s", "--owner", "me", "--token-file", tokenFile)
	if code != 0 || !strings.Contains(out, `"acquired": true`) {
		t.Fatalf("acquire with --ca-file: exit %d %s %s", code, out, errOut)
	}
	if got := auths(); len(got) == 0 || got[len(got)-1] != "Bearer projected-token" {
		t.Fatalf("the route saw Authorization %q", got)
	}
	// The same from the environment, as a pod would set it.
	code, out, errOut = ql([]string{"QUEEN_LOCKS_URL=" + base, "QUEEN_LOCKS_CA_FILE=" + caFile, "QUEEN_LOCKS_TOKEN_FILE=" + tokenFile},
		"get", "tls")
	if code != 0 || !strings.Contains(out, `"owner": "me"`) {
		t.Fatalf("get with QUEEN_LOCKS_CA_FILE: exit %d %s %s", code, out, errOut)
	}
	if got := auths(); got[len(got)-1] != "Bearer projected-token" {
		t.Fatalf("the route saw Authorization %q from QUEEN_LOCKS_TOKEN_FILE", got)
	}
	// Without the CA: a clear error naming the certificate problem, exit 1.
	code, out, errOut = ql(nil, "get", "tls", "--server", base)
	if code != 1 || !strings.Contains(errOut, "certificate signed by unknown authority") || !strings.Contains(errOut, "CA file") {
		t.Fatalf("without the CA: exit %d %s %s", code, out, errOut)
	}
	// run over TLS: the command runs and the lock is released after.
	marker := filepath.Join(dir, "ran")
	code, _, errOut = ql([]string{"QUEEN_LOCKS_CA_FILE=" + caFile}, "run", "tls-run", "--server", base, "--ttl", "30s", "--", "touch", marker)
	if code != 0 || !exists(marker) {
		t.Fatalf("run over TLS: exit %d, ran %v: %s", code, exists(marker), errOut)
	}
	if owners := heldBy(t, ns); len(owners) != 1 || owners[0] != "me" {
		t.Fatalf("permits after the run held by %q, want only me's", owners)
	}
	// --ca-file without a route is a usage error, not silently ignored.
	code, _, errOut = ql(nil, "get", "tls", "--kubeconfig", kubeconfig, "--ca-file", caFile)
	if code != 2 || !strings.Contains(errOut, "--ca-file") {
		t.Fatalf("--ca-file with --kubeconfig: exit %d %s", code, errOut)
	}
}
