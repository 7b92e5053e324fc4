package dashboard_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/dashboard"
	"github.com/queen-locks/queen-locks/permit"
)

// reply is a response whose body was read and closed.
type reply struct {
	StatusCode int
	Status     string
	Header     http.Header
}

// do sends one request to the page's server and answers the response and
// its body.
func do(t *testing.T, method, rawURL, host string, hdr map[string]string, body string) (reply, string) {
	t.Helper()
	req, err := http.NewRequest(method, rawURL, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{StatusCode: resp.StatusCode, Status: resp.Status, Header: resp.Header}, string(b)
}

// Every way in without the URL's secret finds nothing: the page, its
// assets, the event stream (whose rows carry tokens) and the release.
// Every answer, refusals included, forbids caching and carries no CORS
// header.
func TestEveryRequestNeedsTheSecret(t *testing.T) {
	ns := env.Namespace(t, "dash-secret")
	s := serve(t, env.Config, dashboard.Options{Namespace: ns})
	u, _ := url.Parse(s.URL)
	secret := strings.Trim(u.Path, "/")
	base := "http://" + u.Host
	same := map[string]string{"Origin": base, "Sec-Fetch-Site": "same-origin", "Content-Type": "application/json"}
	for _, c := range []struct {
		method, path string
	}{
		{"GET", "/"},
		{"GET", "/index.html"},
		{"GET", "/app.js"},
		{"GET", "/events"},
		{"POST", "/release"},
		{"GET", "/" + secret},                        // no slash after: not the page
		{"GET", "/" + secret[:len(secret)-1] + "/"},  // one character short
		{"GET", "/" + secret + "x/events"},           // one too many
		{"GET", "/" + strings.ToUpper(secret) + "/"}, // case matters
		{"GET", "/x/" + secret + "/events"},
		{"GET", "/events?secret=" + secret},
		{"POST", "/x/release"},
	} {
		resp, body := do(t, c.method, base+c.path, "", same, `{"namespace":"`+ns+`","name":"a.0","token":"1"}`)
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s %s: %s, want 404 Not Found", c.method, c.path, resp.Status)
		}
		if strings.Contains(body, "event:") || strings.Contains(body, "<table") {
			t.Errorf("%s %s: answered the page's content: %q", c.method, c.path, body)
		}
		checkHeaders(t, c.method+" "+c.path, resp)
	}
	for _, p := range []string{"", "app.js", "style.css"} {
		resp, body := do(t, "GET", s.URL+p, "", nil, "")
		if resp.StatusCode != http.StatusOK || body == "" {
			t.Errorf("GET %s with the secret: %s", p, resp.Status)
		}
		checkHeaders(t, "GET "+p, resp)
	}
	resp, _ := do(t, "GET", s.URL, "", nil, "")
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	if rp := resp.Header.Get("Referrer-Policy"); rp != "no-referrer" {
		t.Errorf("Referrer-Policy %q: the URL's secret could leave in a Referer", rp)
	}
	// A preflight is never answered yes.
	resp, _ = do(t, "OPTIONS", s.URL+"release", "", map[string]string{
		"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}, "")
	if resp.StatusCode < 400 {
		t.Errorf("OPTIONS: %s", resp.Status)
	}
	checkHeaders(t, "OPTIONS", resp)
}

func checkHeaders(t *testing.T, what string, resp reply) {
	t.Helper()
	if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("%s: Cache-Control %q, want no-store", what, cc)
	}
	for k := range resp.Header {
		if strings.HasPrefix(strings.ToLower(k), "access-control-") {
			t.Errorf("%s: a CORS header %s: %q", what, k, resp.Header.Get(k))
		}
	}
}

// DNS rebinding: a page of another site whose name resolves to 127.0.0.1
// reaches the port with its own name in Host. Only loopback names with
// the server's own port are answered, the secret notwithstanding.
func TestForeignHostIsRefused(t *testing.T) {
	ns := env.Namespace(t, "dash-host")
	s := serve(t, env.Config, dashboard.Options{Namespace: ns})
	u, _ := url.Parse(s.URL)
	_, port, _ := strings.Cut(u.Host, ":")
	for _, host := range []string{"evil.example:" + port, "evil.example", "127.0.0.1", "127.0.0.1:1", "localhost.evil.example:" + port,
		"127.0.0.2:" + port, "0.0.0.0:" + port, "[::1]:1"} {
		for _, path := range []string{"", "events"} {
			resp, body := do(t, "GET", s.URL+path, host, map[string]string{"Sec-Fetch-Site": "same-origin"}, "")
			if resp.StatusCode != http.StatusMisdirectedRequest {
				t.Errorf("Host %s, /%s: %s, want 421", host, path, resp.Status)
			}
			if strings.Contains(body, "<table") || strings.Contains(body, "event:") {
				t.Errorf("Host %s: answered content", host)
			}
		}
	}
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "LOCALHOST:" + port, "[::1]:" + port} {
		if resp, _ := do(t, "GET", s.URL, host, nil, ""); resp.StatusCode != http.StatusOK {
			t.Errorf("Host %s: %s, want 200", host, resp.Status)
		}
	}
}

// A write that another page makes (a form or fetch of another origin,
// which can reach loopback) is refused before anything is deleted, even
// with the secret, and so are reads of the stream another site asks for.
func TestCrossOriginRequestsAreRefused(t *testing.T) {
	ns := env.Namespace(t, "dash-origin")
	s := serve(t, env.Config, dashboard.Options{Namespace: ns})
	u, _ := url.Parse(s.URL)
	origin := "http://" + u.Host
	a := acquire(t, ns, "nightly", "cron-1", 600)
	body := `{"namespace":"` + ns + `","name":"nightly.0","token":"` + tokenString(a.Token) + `"}`
	for _, c := range []struct {
		name string
		hdr  map[string]string
		want int
	}{
		{"another origin", map[string]string{"Origin": "http://evil.example", "Content-Type": "application/json"}, http.StatusForbidden},
		{"another port", map[string]string{"Origin": "http://127.0.0.1:1", "Content-Type": "application/json"}, http.StatusForbidden},
		{"https of the same host", map[string]string{"Origin": "https://" + u.Host, "Content-Type": "application/json"}, http.StatusForbidden},
		{"an opaque origin", map[string]string{"Origin": "null", "Content-Type": "application/json"}, http.StatusForbidden},
		{"no Origin, cross-site", map[string]string{"Sec-Fetch-Site": "cross-site", "Content-Type": "application/json"}, http.StatusForbidden},
		{"no Origin, same-site", map[string]string{"Sec-Fetch-Site": "same-site", "Content-Type": "application/json"}, http.StatusForbidden},
		{"neither header", map[string]string{"Content-Type": "application/json"}, http.StatusForbidden},
		{"a form's content type", map[string]string{"Origin": origin, "Content-Type": "text/plain"}, http.StatusUnsupportedMediaType},
	} {
		resp, _ := do(t, "POST", s.URL+"release", "", c.hdr, body)
		if resp.StatusCode != c.want {
			t.Errorf("%s: %s, want %d", c.name, resp.Status, c.want)
		}
		checkHeaders(t, c.name, resp)
	}
	for _, site := range []string{"cross-site", "same-site"} {
		if resp, _ := do(t, "GET", s.URL+"events", "", map[string]string{"Sec-Fetch-Site": site}, ""); resp.StatusCode != http.StatusForbidden {
			t.Errorf("events asked for by a %s page: %s, want 403", site, resp.Status)
		}
	}
	if !held(t, ns, "nightly.0", a.Token) {
		t.Fatal("a refused request released the permit")
	}
	// The page's own request goes through.
	resp, got := do(t, "POST", s.URL+"release", "", map[string]string{"Origin": origin, "Content-Type": "application/json"}, body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(got, `"released":true`) {
		t.Fatalf("same-origin release: %s %s", resp.Status, got)
	}
}

func tokenString(t uint64) string { b, _ := json.Marshal(t); return string(b) }

// held says whether permit name is there with token tok.
func held(t *testing.T, ns, name string, tok uint64) bool {
	t.Helper()
	p := &locksv1alpha1.QueenLock{}
	err := env.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, p)
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	got, _ := permit.Token(p.ResourceVersion)
	return got == tok
}
