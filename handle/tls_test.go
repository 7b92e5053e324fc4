package handle_test

import (
	"context"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/internal/testcert"
)

// newCA is a certificate authority made for one test.
func newCA(t *testing.T) *testcert.CA {
	t.Helper()
	ca, err := testcert.New()
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// tlsRoute is the real route of ns behind a TLS-terminating reverse proxy
// whose certificate ca signs. It records the Authorization headers it saw.
type tlsRoute struct {
	URL   string // the route's full https:// address
	mu    sync.Mutex
	auths []string
}

func (r *tlsRoute) lastAuth() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.auths) == 0 {
		return ""
	}
	return r.auths[len(r.auths)-1]
}

func serveTLSRoute(t *testing.T, ns string, ca *testcert.CA) *tlsRoute {
	t.Helper()
	plain, _ := startRoute(t, ns)
	target, err := url.Parse(plain)
	if err != nil {
		t.Fatal(err)
	}
	r := &tlsRoute{}
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: target.Scheme, Host: target.Host})
	srv, err := ca.StartServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.auths = append(r.auths, req.Header.Get("Authorization"))
		r.mu.Unlock()
		proxy.ServeHTTP(w, req)
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	r.URL = srv.URL + route.Path
	return r
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestTheRouteOverTLSWithACAFile(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	ca := newCA(t)
	r := serveTLSRoute(t, ns, ca)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")

	t.Run("trusted", func(t *testing.T) {
		writeFile(t, caFile, ca.PEM)
		h := handle.New(handle.HTTP(r.URL, handle.HTTPOptions{CAFile: caFile})).Lock("over-tls", 30*time.Second)
		if ok, err := h.Acquire(ctx); !ok || err != nil {
			t.Fatalf("acquire over TLS: %v %v", ok, err)
		}
		if p := stored(t, ns, "over-tls", 0); p == nil || p.Spec.Owner != h.Owner() {
			t.Fatalf("stored %v", p)
		}
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("no CA file", func(t *testing.T) {
		h := handle.New(handle.HTTP(r.URL, handle.HTTPOptions{})).Lock("over-tls", 30*time.Second)
		ok, err := h.Acquire(ctx)
		if ok || err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") ||
			!strings.Contains(err.Error(), "CA file") {
			t.Fatalf("acquire without the CA: %v %v", ok, err)
		}
	})
	t.Run("another CA, then the right one", func(t *testing.T) {
		writeFile(t, caFile, newCA(t).PEM)
		tr := handle.HTTP(r.URL, handle.HTTPOptions{CAFile: caFile})
		if _, err := tr.Get(ctx, "over-tls"); err == nil || !strings.Contains(err.Error(), "unknown authority") {
			t.Fatalf("get trusting another CA: %v", err)
		}
		// The file changes (a rotated CA): the next call trusts its content.
		writeFile(t, caFile, ca.PEM)
		if _, err := tr.Get(ctx, "over-tls"); err != nil {
			t.Fatalf("get after the CA file changed: %v", err)
		}
	})
	t.Run("bad CA files", func(t *testing.T) {
		garbage := filepath.Join(dir, "garbage.crt")
		writeFile(t, garbage, []byte("not a certificate\n"))
		for file, want := range map[string]string{
			garbage:                       "holds no PEM certificate",
			filepath.Join(dir, "missing"): "reading the CA file",
		} {
			_, err := handle.HTTP(r.URL, handle.HTTPOptions{CAFile: file}).Get(ctx, "over-tls")
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), file) {
				t.Errorf("CA file %s: %v, want an error naming it with %q", file, err, want)
			}
		}
	})
}

// The token: from $QUEEN_LOCKS_TOKEN_FILE when neither Token nor TokenFile
// is given, read again at every call, so a rotated token is sent.
func TestTokenFileFromTheEnvironmentIsReReadAtEveryCall(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	ca := newCA(t)
	r := serveTLSRoute(t, ns, ca)
	dir := t.TempDir()
	caFile, tokenFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "token")
	writeFile(t, caFile, ca.PEM)
	writeFile(t, tokenFile, []byte("first-token\n"))
	t.Setenv(handle.TokenFileEnv, tokenFile)
	tr := handle.HTTP(r.URL, handle.HTTPOptions{CAFile: caFile})
	if _, err := tr.Get(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if got := r.lastAuth(); got != "Bearer first-token" {
		t.Fatalf("Authorization %q", got)
	}
	writeFile(t, tokenFile, []byte("rotated-token\n"))
	if _, err := tr.Get(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if got := r.lastAuth(); got != "Bearer rotated-token" {
		t.Fatalf("Authorization after rotation %q", got)
	}
	// An explicit Token wins over the environment.
	if _, err := handle.HTTP(r.URL, handle.HTTPOptions{CAFile: caFile, Token: "given"}).Get(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if got := r.lastAuth(); got != "Bearer given" {
		t.Fatalf("Authorization with Token %q", got)
	}
	// A token file the environment names but that is missing is an error,
	// not a silent call without credentials.
	t.Setenv(handle.TokenFileEnv, filepath.Join(dir, "missing"))
	if _, err := handle.HTTP(r.URL, handle.HTTPOptions{CAFile: caFile}).Get(ctx, "x"); err == nil || !strings.Contains(err.Error(), "reading the token") {
		t.Fatalf("missing token file: %v", err)
	}
}
