package handle_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
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

// sendsAuth answers a check that a call through tr reaches r with the
// Authorization header want (when says at which step).
func sendsAuth(t *testing.T, tr handle.Transport, r *tlsRoute) func(want, when string) {
	t.Helper()
	return func(want, when string) {
		t.Helper()
		if _, err := tr.Get(context.Background(), "x"); err != nil {
			t.Fatal(err)
		}
		if got := r.lastAuth(); got != want {
			t.Fatalf("Authorization %s: %q, want %q", when, got, want)
		}
	}
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
// is given, and read again when the file changes, so a rotated token is
// sent by the next call.
func TestTokenFileFromTheEnvironmentIsReRead(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	ca := newCA(t)
	r := serveTLSRoute(t, ns, ca)
	dir := t.TempDir()
	caFile, tokenFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "token")
	writeFile(t, caFile, ca.PEM)
	writeFile(t, tokenFile, []byte("first-token\n"))
	t.Setenv(handle.TokenFileEnv, tokenFile)
	clock := newFakeNow()
	tr := handle.HTTPWith(r.URL, handle.HTTPOptions{CAFile: caFile}, filepath.Join(dir, "no-default"), clock.Now)
	get := sendsAuth(t, tr, r)
	get("Bearer first-token", "at first")
	// Another file put in its place, as the kubelet rotates a projected
	// token (by swapping a symlink): the next call sends it, however soon,
	// though it has the same size and modification time.
	replace(t, tokenFile, "other-token\n")
	get("Bearer other-token", "after the file was replaced")
	// Rewritten in place with a new size: the same.
	writeFile(t, tokenFile, []byte("the-third-token\n"))
	get("Bearer the-third-token", "after the file was rewritten")
	// A rewrite that a stat cannot tell (same size and modification
	// time) is read once TokenReread has passed since the last read.
	rewriteUnseen(t, tokenFile, "the-other-token\n")
	clock.Add(handle.TokenReread - time.Millisecond)
	get("Bearer the-third-token", "before TokenReread has passed")
	clock.Add(time.Millisecond)
	get("Bearer the-other-token", "once TokenReread has passed")
	// An explicit Token wins over the environment.
	if _, err := handle.HTTP(r.URL, handle.HTTPOptions{CAFile: caFile, Token: "given"}).Get(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if got := r.lastAuth(); got != "Bearer given" {
		t.Fatalf("Authorization with Token %q", got)
	}
	// A token file the environment names but that is missing is an error,
	// not a silent call without credentials; so is one that goes missing,
	// once it is read again.
	t.Setenv(handle.TokenFileEnv, filepath.Join(dir, "missing"))
	if _, err := handle.HTTP(r.URL, handle.HTTPOptions{CAFile: caFile}).Get(ctx, "x"); err == nil || !strings.Contains(err.Error(), "reading the token") {
		t.Fatalf("missing token file: %v", err)
	}
	if err := os.Remove(tokenFile); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Get(ctx, "x"); err == nil || !strings.Contains(err.Error(), "reading the token") {
		t.Fatalf("token file removed: %v", err)
	}
}

// A 401 of the route makes the next call read the token file again, before
// TokenReread has passed: the token sent may be one the file has replaced.
func TestTokenFileIsReReadAfterA401(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	plain, _ := startRoute(t, ns)
	target, err := url.Parse(plain)
	if err != nil {
		t.Fatal(err)
	}
	// The route's answer to a token it does not accept, in front of the
	// real route (which this test serves with --auth=none).
	var mu sync.Mutex
	valid, sent := "first-token", ""
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: target.Scheme, Host: target.Host})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		sent = req.Header.Get("Authorization")
		ok := sent == "Bearer "+valid
		mu.Unlock()
		if !ok {
			w.Header().Set("WWW-Authenticate", "Bearer")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":{"code":401,"message":"token not valid for audience queen-locks"}}`))
			return
		}
		proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	writeFile(t, tokenFile, []byte("first-token"))
	tr := handle.HTTPWith(srv.URL+route.Path, handle.HTTPOptions{TokenFile: tokenFile}, filepath.Join(dir, "no-default"), newFakeNow().Now)
	if _, err := tr.Get(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	rewriteUnseen(t, tokenFile, "fresh-token")
	mu.Lock()
	valid = "fresh-token"
	mu.Unlock()
	var ce *handle.CallError
	if _, err := tr.Get(ctx, "x"); !errors.As(err, &ce) || ce.Code != http.StatusUnauthorized {
		t.Fatalf("a call with the token the file replaced: %v, want the route's 401", err)
	}
	if _, err := tr.Get(ctx, "x"); err != nil {
		t.Fatalf("the call after a 401: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if sent != "Bearer fresh-token" {
		t.Fatalf("the call after a 401 sent %q", sent)
	}
}

// A missing default token file means no token, and is looked for again once
// TokenReread has passed: a token mounted later is sent from then on.
func TestMissingDefaultTokenFileIsLookedForAgain(t *testing.T) {
	ns := namespace(t)
	ca := newCA(t)
	r := serveTLSRoute(t, ns, ca)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	writeFile(t, caFile, ca.PEM)
	t.Setenv(handle.TokenFileEnv, "")
	projected := filepath.Join(dir, "projected")
	clock := newFakeNow()
	tr := handle.HTTPWith(r.URL, handle.HTTPOptions{CAFile: caFile}, projected, clock.Now)
	get := sendsAuth(t, tr, r)
	get("", "without the default file")
	writeFile(t, projected, []byte("mounted-token\n"))
	get("", "before TokenReread has passed")
	clock.Add(handle.TokenReread)
	get("Bearer mounted-token", "once TokenReread has passed")
}

// replace puts a new file holding content at path, in one rename, with
// the size and modification time of the one it replaces: only its identity
// tells them apart.
func replace(t *testing.T, path, content string) {
	t.Helper()
	fi := sizedAs(t, path, content)
	writeFile(t, path+".new", []byte(content))
	if err := os.Chtimes(path+".new", time.Time{}, fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// sizedAs answers the file at path, failing the test unless content is of
// its size: a change of size would show in a stat.
func sizedAs(t *testing.T, path, content string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(content)) != fi.Size() {
		t.Fatalf("%q is not of the size %d of %s", content, fi.Size(), path)
	}
	return fi
}

// rewriteUnseen writes content of the same length into path, in place,
// and gives it back its modification time: a change no stat shows.
func rewriteUnseen(t *testing.T, path, content string) {
	t.Helper()
	fi := sizedAs(t, path, content)
	writeFile(t, path, []byte(content))
	if err := os.Chtimes(path, time.Time{}, fi.ModTime()); err != nil {
		t.Fatal(err)
	}
}

// fakeNow is a clock that moves only when told.
type fakeNow struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeNow() *fakeNow { return &fakeNow{now: time.Now()} }

func (c *fakeNow) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *fakeNow) Add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }
