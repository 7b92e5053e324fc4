package dashboard_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/queen-locks/queen-locks/internal/dashboard"
)

type row struct {
	Namespace, Name, Lock, Owner, Token string
	Slot                                int
}

type upsert struct {
	Kind string
	Row  row
}

type snapshot struct {
	Scope   string
	Permits []row
	Sources []struct{ Source, State, Message string }
	Access  struct {
		Checked    bool
		Namespaces map[string]bool
		Permits    map[string]bool
	}
}

// release posts a release as the page does.
func release(t *testing.T, s *dashboard.Server, ns, name, token string) (int, map[string]any) {
	t.Helper()
	u, _ := url.Parse(s.URL)
	resp, body := do(t, "POST", s.URL+"release", "", map[string]string{"Origin": "http://" + u.Host, "Content-Type": "application/json"},
		`{"namespace":"`+ns+`","name":"`+name+`","token":"`+token+`"}`)
	var a map[string]any
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		t.Fatalf("release answered %s %q", resp.Status, body)
	}
	return resp.StatusCode, a
}

// The stream shows an acquire, a renew and a release made elsewhere as
// they happen: each awaited on the stream itself, with no reload.
func TestStreamFollowsPermits(t *testing.T) {
	ns := env.Namespace(t, "dash-live")
	viewer := identity(t, ns, "viewer", map[string][]string{ns: {"queen-locks-viewer"}})
	s := serve(t, viewer, dashboard.Options{Namespace: ns})
	st := openStream(t, s)
	st.until("permits live", func(m *model) bool { return m.sources["permits"] == "live" })
	if st.model.scope != ns {
		t.Fatalf("scope %q, want %q", st.model.scope, ns)
	}
	ctx := context.Background()
	a := acquire(t, ns, "report", "cron-7", 600)
	isRow := func(tok uint64) func(sse) bool {
		return func(e sse) bool {
			var u upsert
			return e.Name == "upsert" && json.Unmarshal(e.Data, &u) == nil && u.Kind == "permit" &&
				u.Row.Lock == "report" && u.Row.Token == tokenString(tok)
		}
	}
	st.await("the acquire", isRow(a.Token))
	r, err := lockClient().Renew(ctx, ns, "report", 0, a.Token, "cron-7", 600)
	if err != nil || !r.Renewed {
		t.Fatalf("renew: %+v %v", r, err)
	}
	st.await("the renew", isRow(r.Token))
	if ok, err := lockClient().Release(ctx, ns, "report", 0, r.Token, "cron-7"); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	st.await("the release", func(e sse) bool {
		return e.Name == "delete" && strings.Contains(string(e.Data), `"key":"`+ns+`/report.0"`)
	})
	// The viewer may not list pods, ConfigMaps or Secrets: the page says
	// so rather than showing an empty list as if there were none.
	for _, src := range []string{"gated pods", "guarded ConfigMaps", "guarded Secrets"} {
		st.until(src+" forbidden", func(m *model) bool { return m.sources[src] == "forbidden" })
	}
}

// A viewer's page offers no release, and a release it forges anyway is
// refused by the API server: the page has no rights of its own.
func TestViewerCannotRelease(t *testing.T) {
	ns := env.Namespace(t, "dash-viewer")
	viewer := identity(t, ns, "viewer", map[string][]string{ns: {"queen-locks-viewer"}})
	a := acquire(t, ns, "stuck", "gone-holder", 600)
	s := serve(t, viewer, dashboard.Options{Namespace: ns})
	st := openStream(t, s)
	st.until("access checked", func(m *model) bool { return m.access.Checked })
	if acc := st.model.access; len(acc.Namespaces) != 0 || len(acc.Permits) != 0 {
		t.Fatalf("a viewer may release %+v", acc)
	}
	code, ans := release(t, s, ns, "stuck.0", tokenString(a.Token))
	if code != http.StatusForbidden || ans["reason"] != "forbidden" {
		t.Fatalf("forged release: %d %v, want 403 forbidden", code, ans)
	}
	if !held(t, ns, "stuck.0", a.Token) {
		t.Fatal("the viewer's forged release deleted the permit")
	}
}

// A releaser's delete carries the token of the row it saw: a permit
// renewed since is not deleted, and the answer says what it is now.
func TestReleaseNeedsTheTokenSeen(t *testing.T) {
	ns := env.Namespace(t, "dash-release")
	op := identity(t, ns, "oncall", map[string][]string{ns: {"queen-locks-holder"}})
	s := serve(t, op, dashboard.Options{Namespace: ns})
	st := openStream(t, s)
	st.until("access", func(m *model) bool { return m.access.Namespaces[ns] })
	a := acquire(t, ns, "stuck", "holder", 600)
	r, err := lockClient().Renew(context.Background(), ns, "stuck", 0, a.Token, "holder", 600)
	if err != nil || !r.Renewed {
		t.Fatal(r, err)
	}
	code, ans := release(t, s, ns, "stuck.0", tokenString(a.Token))
	if code != http.StatusOK || ans["released"] != false || ans["reason"] != "changed" {
		t.Fatalf("release with the token before the renew: %d %v, want changed", code, ans)
	}
	if cur, _ := ans["current"].(map[string]any); cur == nil || cur["token"] != tokenString(r.Token) {
		t.Fatalf("current %v, want token %d", ans["current"], r.Token)
	}
	if !held(t, ns, "stuck.0", r.Token) {
		t.Fatal("a release with a stale token deleted the renewed permit")
	}
	if code, ans = release(t, s, ns, "stuck.0", tokenString(r.Token)); code != http.StatusOK || ans["released"] != true {
		t.Fatalf("release with the current token: %d %v", code, ans)
	}
	if code, ans = release(t, s, ns, "stuck.0", tokenString(r.Token)); ans["reason"] != "gone" {
		t.Fatalf("release again: %d %v, want gone", code, ans)
	}
	// Bad input names what is wrong, and deletes nothing.
	for _, body := range []string{`{"namespace":"` + ns + `","name":"x.0","token":"-1"}`, `{"namespace":"other","name":"x.0","token":"1"}`,
		`{"namespace":"` + ns + `","name":"x.0","token":"1","extra":1}`, `not json`} {
		u, _ := url.Parse(s.URL)
		resp, got := do(t, "POST", s.URL+"release", "", map[string]string{"Origin": "http://" + u.Host, "Content-Type": "application/json"}, body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(got, "invalid") {
			t.Errorf("%s: %s %s, want 400", body, resp.Status, got)
		}
	}
}

// A caller with no rights in a namespace sees nothing of it: no rows, the
// refusal said, and no release.
func TestNoRightsShowsNothing(t *testing.T) {
	theirs := env.Namespace(t, "dash-theirs")
	mine := env.Namespace(t, "dash-mine")
	a := acquire(t, theirs, "secret-job", "them", 600)
	stranger := identity(t, mine, "stranger", map[string][]string{mine: {"queen-locks-holder", "dashboard-test-reader"}})
	for _, o := range []dashboard.Options{{Namespace: theirs}, {AllNamespaces: true}} {
		s := serve(t, stranger, o)
		st := openStream(t, s)
		st.until("permits forbidden", func(m *model) bool { return m.sources["permits"] == "forbidden" })
		// A fresh stream carries the whole state: nothing of theirs.
		snap := openStream(t, s).await("snapshot", func(e sse) bool { return e.Name == "snapshot" })
		if strings.Contains(string(snap.Data), "secret-job") || strings.Contains(string(snap.Data), `"them"`) {
			t.Fatalf("%+v: the snapshot shows their permit: %s", o, snap.Data)
		}
		if o.Namespace != "" {
			if code, ans := release(t, s, theirs, "secret-job.0", tokenString(a.Token)); code != http.StatusForbidden {
				t.Fatalf("release in their namespace: %d %v", code, ans)
			}
		}
	}
	if !held(t, theirs, "secret-job.0", a.Token) {
		t.Fatal("their permit was released")
	}
}
