package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/dashboard"
	"github.com/queen-locks/queen-locks/locks"
)

var env *controlplane.Env

func TestMain(m *testing.M) {
	// No expiry controller: a permit past its expiry stays, as it does
	// when no manager runs, which is when a lock gets stuck and somebody
	// opens this page.
	os.Exit(controlplane.TestMain(m, controlplane.Options{NoExpiry: true}, func(e *controlplane.Env) {
		env = e
		for _, f := range []string{"config/rbac/viewer_role.yaml", "config/rbac/holder_role.yaml"} {
			if err := e.ApplyFile(f); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
		// What the page reads besides permits: gated pods, and the
		// metadata of guarded ConfigMaps and Secrets.
		reader := &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "dashboard-test-reader"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods", "configmaps", "secrets"},
				Verbs: []string{"get", "list", "watch"}}},
		}
		if err := e.Client.Create(context.Background(), reader); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}))
}

// identity is a ServiceAccount of namespace ns with a token of its own,
// bound to the ClusterRoles roles[namespace]: a caller with real
// credentials that the API server authenticates and RBAC authorizes,
// as a person's kubeconfig would be.
func identity(t *testing.T, ns, name string, roles map[string][]string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := env.Client.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	for where, rs := range roles {
		for _, r := range rs {
			rb := &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Namespace: where, Name: name + "-" + r},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: r},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
			}
			if err := env.Client.Create(ctx, rb); err != nil {
				t.Fatal(err)
			}
		}
	}
	tr, err := env.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &rest.Config{Host: env.Config.Host, BearerToken: tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}}
}

// serve starts a page for cfg until the test ends.
func serve(t *testing.T, cfg *rest.Config, o dashboard.Options) *dashboard.Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := dashboard.Start(ctx, cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = s.Wait()
	})
	return s
}

// lockClient acquires, renews and releases "elsewhere": as the admin,
// through the same lock operations the route and handles use.
func lockClient() *locks.Client { return locks.New(env.Client, clock.RealClock{}) }

func acquire(t *testing.T, ns, lock, owner string, ttl int64) locks.Acquired {
	t.Helper()
	a, err := lockClient().Acquire(context.Background(), ns, lock, owner, ttl, 1)
	if err != nil || !a.Acquired {
		t.Fatalf("acquiring %s: %+v %v", lock, a, err)
	}
	return a
}

// stream reads the page's event stream as the page does.
type stream struct {
	t     *testing.T
	resp  *http.Response
	sc    *bufio.Scanner
	model model
}

type sse struct {
	Name string
	Data json.RawMessage
}

func openStream(t *testing.T, s *dashboard.Server) *stream {
	t.Helper()
	return openStreamURL(t, s.URL)
}

// openStreamURL opens the event stream of the page at url.
func openStreamURL(t *testing.T, url string) *stream {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url+"events", nil)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("events: %s", resp.Status)
	}
	t.Cleanup(func() { resp.Body.Close() })
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	return &stream{t: t, resp: resp, sc: sc}
}

func (st *stream) next() sse {
	st.t.Helper()
	var ev sse
	for st.sc.Scan() {
		line := st.sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			ev.Name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.Data = json.RawMessage(strings.TrimPrefix(line, "data: "))
		case line == "" && ev.Name != "":
			return ev
		}
	}
	st.t.Fatalf("the event stream ended: %v", st.sc.Err())
	return ev
}

// await reads events until ok says one is the awaited one, or a minute
// passes (a hung stream fails rather than hangs the suite).
func (st *stream) await(what string, ok func(sse) bool) sse {
	st.t.Helper()
	timer := time.AfterFunc(time.Minute, func() { st.resp.Body.Close() })
	defer timer.Stop()
	for {
		ev := st.next()
		st.model.apply(ev)
		if os.Getenv("QUEEN_LOCKS_TEST_VERBOSE") != "" {
			st.t.Logf("%s %.300s", ev.Name, ev.Data)
		}
		if ok(ev) {
			return ev
		}
		_ = what
	}
}

// model is what the page knows, from the events so far.
type model struct {
	scope   string
	permits map[string]row    // "ns/name"
	sources map[string]string // source -> state
	access  struct {
		Checked    bool
		Namespaces map[string]bool
		Permits    map[string]bool
	}
}

func (m *model) apply(ev sse) {
	switch ev.Name {
	case "snapshot":
		var sn snapshot
		_ = json.Unmarshal(ev.Data, &sn)
		m.scope = sn.Scope
		m.permits = map[string]row{}
		for _, r := range sn.Permits {
			m.permits[r.Namespace+"/"+r.Name] = r
		}
		m.sources = map[string]string{}
		for _, s := range sn.Sources {
			m.sources[s.Source] = s.State
		}
		m.access = sn.Access
	case "upsert", "reset", "delete":
		var u struct {
			Kind string
			Row  row
			Rows []row
			Key  string
		}
		_ = json.Unmarshal(ev.Data, &u)
		if u.Kind != "permit" {
			return
		}
		switch ev.Name {
		case "upsert":
			m.permits[u.Row.Namespace+"/"+u.Row.Name] = u.Row
		case "delete":
			delete(m.permits, u.Key)
		case "reset":
			m.permits = map[string]row{}
			for _, r := range u.Rows {
				m.permits[r.Namespace+"/"+r.Name] = r
			}
		}
	case "status":
		var s struct{ Source, State string }
		_ = json.Unmarshal(ev.Data, &s)
		m.sources[s.Source] = s.State
	case "access":
		_ = json.Unmarshal(ev.Data, &m.access)
	}
}

// until reads events until ok holds of the model.
func (st *stream) until(what string, ok func(*model) bool) {
	st.t.Helper()
	if st.model.permits != nil && ok(&st.model) {
		return
	}
	st.await(what, func(sse) bool { return st.model.permits != nil && ok(&st.model) })
}
