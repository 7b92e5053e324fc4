package route_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/queen-locks/queen-locks/internal/route"
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

// state is every permit of ns by name, with its token: what a refused call
// must leave as it was.
func state(t *testing.T, ns string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range permits(t, ns) {
		out[p.Name] = p.ResourceVersion + "/" + p.Spec.Owner
	}
	return out
}

// audienceOf reads the aud claim of a JWT, unverified: the test only needs
// to know which audience the API server gave a token.
func audienceOf(t *testing.T, jwt string) []string {
	t.Helper()
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %d parts", len(parts))
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct {
		Aud []string `json:"aud"`
	}
	if err := json.Unmarshal(raw, &claims); err != nil {
		t.Fatal(err)
	}
	return claims.Aud
}

func TestTokenAuth(t *testing.T) {
	installRoles(t)
	a, b := namespace(t), namespace(t)
	holder := serviceAccount(t, a, "worker", "queen-locks-holder")
	viewer := serviceAccount(t, a, "dashboard", "queen-locks-viewer")
	nobody := serviceAccount(t, a, "nobody", "")

	t.Run("no token is 401 with WWW-Authenticate and no detail", func(t *testing.T) {
		// A body the decoder would refuse in detail: credentials come first.
		resp, out := post(t, tokenURL, nil, `{"operations":[{"op":"nope"}]}`)
		e := errorOf(t, out)
		if resp.StatusCode != http.StatusUnauthorized || num(t, e["code"]) != 401 || !strings.HasPrefix(e["message"].(string), "no credentials") {
			t.Fatalf("answered %d: %v", resp.StatusCode, out)
		}
		if h := resp.Header.Get("WWW-Authenticate"); !strings.HasPrefix(h, "Bearer") {
			t.Fatalf("WWW-Authenticate %q", h)
		}
	})
	t.Run("a bad token is 401 and says only what the caller needs", func(t *testing.T) {
		resp, out := post(t, tokenURL, bearer("Bearer", "not-a-token"), body(a, acquire("x", "o", 30, 0)))
		msg := errorOf(t, out)["message"].(string)
		if resp.StatusCode != http.StatusUnauthorized || msg != "token not valid for audience queen-locks" {
			t.Fatalf("answered %d: %v", resp.StatusCode, out)
		}
		if h := resp.Header.Get("WWW-Authenticate"); !strings.HasPrefix(h, "Bearer") {
			t.Fatalf("WWW-Authenticate %q", h)
		}
	})
	t.Run("the scheme is taken in any case", func(t *testing.T) {
		// RFC 9110 allows one or more spaces between scheme and token.
		for _, scheme := range []string{"bearer", "BEARER", "Bearer", "Bearer  ", "bearer    "} {
			resp, out := post(t, tokenURL, bearer(scheme, holder), body("", `{"op":"get","name":"case"}`))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: answered %d: %v", scheme, resp.StatusCode, out)
			}
		}
	})
	t.Run("a credential is one token: anything after it is refused", func(t *testing.T) {
		for _, h := range []string{"Bearer  " + holder + " junk", "Bearer " + holder + "\tjunk", "Bearer", "Bearer   "} {
			resp, out := post(t, tokenURL, http.Header{"Authorization": {h}}, body("", `{"op":"get","name":"case"}`))
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("Authorization %.20q...: answered %d: %v", h, resp.StatusCode, out)
			}
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
		e := errorOf(t, out)
		if code != http.StatusForbidden || !strings.Contains(e["message"].(string), "forbidden") || num(t, e["index"]) != 0 {
			t.Fatalf("answered %d: %v", code, out)
		}
		if ps := permits(t, b); len(ps) != 0 {
			t.Fatalf("wrote in %s: %v", b, ps)
		}
	})
	t.Run("a viewer reads but cannot acquire, even a held lock or as its holder", func(t *testing.T) {
		held := one(t, a, acquire("viewed", "owner-1", 30, 0))
		code, out := call(t, tokenURL, viewer, body(a, `{"op":"get","name":"viewed"}`))
		if code != http.StatusOK || len(out["results"].([]any)[0].(J)["holders"].([]any)) != 1 {
			t.Fatalf("get answered %d: %v", code, out)
		}
		for _, op := range []string{acquire("viewed", "v", 30, 0), acquire("viewed", "owner-1", 30, 0), acquire("free", "v", 30, 0)} {
			code, out = call(t, tokenURL, viewer, body(a, op))
			if code != http.StatusForbidden {
				t.Fatalf("%s answered %d: %v", op, code, out)
			}
			if strings.Contains(fmt.Sprint(out), fmt.Sprint(num(t, held["token"]))) {
				t.Fatalf("a refused call showed the holder's token: %v", out)
			}
		}
	})
	t.Run("a ServiceAccount without rights is 403", func(t *testing.T) {
		code, out := call(t, tokenURL, nobody, body("", `{"op":"get","name":"job"}`))
		if code != http.StatusForbidden {
			t.Fatalf("answered %d: %v", code, out)
		}
	})
}

// The audience is what keeps the token a caller sends the route from being
// worth anything on the API server: the API server's own tokens are refused
// unless an operator adds that audience.
func TestAudiences(t *testing.T) {
	installRoles(t)
	ns := namespace(t)
	serviceAccount(t, ns, "worker", "queen-locks-holder")
	apiToken := token(t, ns, "worker", nil)
	apiAud := audienceOf(t, apiToken)
	if len(apiAud) == 0 || apiAud[0] == route.Audience {
		t.Fatalf("the API server's token has audiences %v", apiAud)
	}
	get := body("", `{"op":"get","name":"aud"}`)
	if code, out := call(t, tokenURL, apiToken, get); code != http.StatusUnauthorized ||
		errorOf(t, out)["message"] != "token not valid for audience queen-locks" {
		t.Fatalf("an API-server-audience token answered %d: %v", code, out)
	}
	other := token(t, ns, "worker", nil, "something-else")
	if code, out := call(t, tokenURL, other, get); code != http.StatusUnauthorized {
		t.Fatalf("a token of another audience answered %d: %v", code, out)
	}

	url, stop, err := env.StartRouteConfig(route.Config{Auth: route.AuthToken, Audiences: []string{route.Audience, apiAud[0]}})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if code, out := call(t, url, apiToken, get); code != http.StatusOK {
		t.Fatalf("with the API server's audience added, its token answered %d: %v", code, out)
	}
	if code, out := call(t, url, other, get); code != http.StatusUnauthorized {
		t.Fatalf("a token of an audience not added answered %d: %v", code, out)
	}
}

// The route knows which pod a pod-bound token was issued for, as the
// kubelet's projected tokens are.
func TestCallerOfAPodBoundToken(t *testing.T) {
	ns := namespace(t)
	serviceAccount(t, ns, "worker", "")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "job-x2k9p"},
		Spec:       corev1.PodSpec{ServiceAccountName: "worker", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	if err := env.Client.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	c, err := route.AuthenticateForTest(env.Config, token(t, ns, "worker", pod, route.Audience))
	if err != nil {
		t.Fatal(err)
	}
	want := route.Caller{Username: "system:serviceaccount:" + ns + ":worker", Namespace: ns, PodName: pod.Name, PodUID: string(pod.UID)}
	if c.Username != want.Username || c.Namespace != want.Namespace || c.PodName != want.PodName || c.PodUID != want.PodUID {
		t.Fatalf("caller %+v, want %+v", c, want)
	}
	c, err = route.AuthenticateForTest(env.Config, token(t, ns, "worker", nil, route.Audience))
	if err != nil || c.PodName != "" || c.PodUID != "" || c.Namespace != ns {
		t.Fatalf("unbound token: caller %+v, %v", c, err)
	}
}

// Every operation is authorized before any runs: a call with one operation
// the caller may not do is refused whole, and the others, which it may do,
// are not applied either.
func TestEachRightIsCheckedBeforeAnythingRuns(t *testing.T) {
	installRoles(t)
	ns := namespace(t)
	all := []string{"create", "update", "delete", "get"}
	for _, missing := range all {
		t.Run("without "+missing, func(t *testing.T) {
			var verbs []string
			for _, v := range all {
				if v != missing {
					verbs = append(verbs, v)
				}
			}
			role := &rbacv1.Role{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "no-" + missing},
				Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"locks.queen.dev"}, Resources: []string{"queenlocks"}, Verbs: verbs}},
			}
			if err := env.Client.Create(context.Background(), role); err != nil {
				t.Fatal(err)
			}
			serviceAccount(t, ns, "sa-no-"+missing, "")
			bind(t, ns, "sa-no-"+missing, "Role", role.Name)
			tok := token(t, ns, "sa-no-"+missing, nil, route.Audience)

			// Two held locks: an operation on each, as a call names every
			// lock once.
			lock, other := "held-"+missing, "other-"+missing
			h := one(t, ns, acquire(lock, "o", 60, 0))
			h2 := one(t, ns, acquire(other, "o", 60, 0))
			renew := fmt.Sprintf(`{"op":"renew","name":%q,"token":%d,"owner":"o"}`, lock, num(t, h["token"]))
			release := fmt.Sprintf(`{"op":"release","name":%q,"token":%d,"owner":"o"}`, other, num(t, h2["token"]))
			fresh := acquire("fresh-"+missing, "p", 60, 0)
			// Each call pairs an operation the caller may do with one it
			// may not, the allowed one first.
			var calls [][]string
			switch missing {
			case "create":
				calls = [][]string{{renew, fresh}}
			case "update":
				calls = [][]string{{release, fresh}, {`{"op":"get","name":"x"}`, renew}}
			case "delete":
				calls = [][]string{{renew, release}}
			case "get":
				calls = [][]string{{renew, `{"op":"get","name":"x"}`}, {renew, fmt.Sprintf(`{"op":"check","name":%q,"expect":1}`, other)}}
			}
			for _, ops := range calls {
				before := state(t, ns)
				code, out := call(t, tokenURL, tok, body(ns, ops...))
				if code != http.StatusForbidden {
					t.Fatalf("%v answered %d: %v", ops, code, out)
				}
				e := errorOf(t, out)
				if num(t, e["index"]) != 1 || !strings.Contains(e["message"].(string), missing) {
					t.Fatalf("%v: error %v does not name operation 1 and %s", ops, e, missing)
				}
				if after := state(t, ns); fmt.Sprint(after) != fmt.Sprint(before) {
					t.Fatalf("%v: a refused call changed the permits:\nbefore %v\nafter  %v", ops, before, after)
				}
			}
			// Without the refused operation, the same caller's call runs.
			if missing != "update" {
				if code, out := call(t, tokenURL, tok, body(ns, renew)); code != http.StatusOK {
					t.Fatalf("the allowed renew alone answered %d: %v", code, out)
				}
			}
		})
	}
}

// Rights and tokens are trusted for at most route.MaxReviewTTL: a revoked
// RoleBinding and a deleted ServiceAccount take effect within it.
func TestRevocationTakesEffectWithinTheCacheTTL(t *testing.T) {
	installRoles(t)
	ns := namespace(t)
	ctx := context.Background()
	get := body("", `{"op":"get","name":"r"}`)
	bound := route.MaxReviewTTL

	t.Run("a deleted RoleBinding", func(t *testing.T) {
		serviceAccount(t, ns, "revoked", "")
		rb := bind(t, ns, "revoked", "ClusterRole", "queen-locks-holder")
		tok := token(t, ns, "revoked", nil, route.Audience)
		if code, out := call(t, tokenURL, tok, get); code != http.StatusOK {
			t.Fatalf("before: %d %v", code, out)
		}
		if err := env.Client.Delete(ctx, rb); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		awaitCode(t, tokenURL, tok, get, http.StatusForbidden, bound)
		t.Logf("refused %s after the RoleBinding was deleted", time.Since(start).Round(time.Millisecond))
	})
	t.Run("a deleted ServiceAccount", func(t *testing.T) {
		tok := serviceAccount(t, ns, "deleted", "queen-locks-holder")
		if code, out := call(t, tokenURL, tok, get); code != http.StatusOK {
			t.Fatalf("before: %d %v", code, out)
		}
		if err := env.Client.Delete(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "deleted"}}); err != nil {
			t.Fatal(err)
		}
		// From when the API server itself refuses the token.
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			tr, err := env.Clientset.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
				Spec: authenticationv1.TokenReviewSpec{Token: tok, Audiences: []string{route.Audience}}}, metav1.CreateOptions{})
			return err == nil && !tr.Status.Authenticated, nil
		})
		if err != nil {
			t.Fatal("the API server never refused the deleted ServiceAccount's token")
		}
		start := time.Now()
		awaitCode(t, tokenURL, tok, get, http.StatusUnauthorized, bound)
		t.Logf("refused %s after the API server refused the token", time.Since(start).Round(time.Millisecond))
	})
}

// A refusal is remembered only briefly: a right granted after a caller was
// refused (or that a restarting API server denied for a moment) counts
// well before an allowed answer would have been refreshed.
func TestARefusalIsForgottenQuickly(t *testing.T) {
	installRoles(t)
	ns := namespace(t)
	tok := serviceAccount(t, ns, "late", "")
	get := body("", `{"op":"get","name":"r"}`)
	if code, out := call(t, tokenURL, tok, get); code != http.StatusForbidden {
		t.Fatalf("before the RoleBinding: %d %v", code, out)
	}
	bind(t, ns, "late", "ClusterRole", "queen-locks-holder")
	start := time.Now()
	// Under the default review TTL (5 s), which an allowed answer keeps.
	awaitCode(t, tokenURL, tok, get, http.StatusOK, route.DefaultReviewTTL-time.Second)
	t.Logf("allowed %s after the RoleBinding was made", time.Since(start).Round(time.Millisecond))
}

// awaitCode calls until the route answers code, failing after bound.
func awaitCode(t *testing.T, url, tok, body string, code int, bound time.Duration) {
	t.Helper()
	var last J
	var got int
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, bound, true, func(context.Context) (bool, error) {
		got, last = call(t, url, tok, body)
		return got == code, nil
	})
	if err != nil {
		t.Fatalf("still %d after %s: %v", got, bound, last)
	}
}

// A ResourceQuota that is used up refuses one acquire, not the call: the
// other operations of the call answer as usual.
func TestQuotaIsAnAnswerOfOneOperation(t *testing.T) {
	installRoles(t)
	ns := namespace(t)
	ctx := context.Background()
	quota := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "locks"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{
			"count/queenlocks.locks.queen.dev": resource.MustParse("1"),
		}},
	}
	if err := env.Client.Create(ctx, quota); err != nil {
		t.Fatal(err)
	}
	// The quota controller is not running here; without it the API server
	// refuses every create until status.hard is filled in, so fill it in as
	// the controller would.
	quota.Status = corev1.ResourceQuotaStatus{Hard: quota.Spec.Hard, Used: corev1.ResourceList{"count/queenlocks.locks.queen.dev": resource.MustParse("0")}}
	if err := env.Client.Status().Update(ctx, quota); err != nil {
		t.Fatal(err)
	}
	holder := serviceAccount(t, ns, "worker", "queen-locks-holder")
	code, out := call(t, tokenURL, holder, body("", acquire("qr0", "w", 30, 0)))
	if code != http.StatusOK || out["results"].([]any)[0].(J)["acquired"] != true {
		t.Fatalf("acquire within the quota answered %d: %v", code, out)
	}
	r0 := out["results"].([]any)[0].(J)
	code, out = call(t, tokenURL, holder, body("",
		fmt.Sprintf(`{"op":"renew","name":"qr0","token":%d,"owner":"w"}`, num(t, r0["token"])), acquire("qr1", "w", 30, 0)))
	if code != http.StatusOK {
		t.Fatalf("answered %d: %v", code, out)
	}
	rs := out["results"].([]any)
	if rs[0].(J)["renewed"] != true || rs[1].(J)["acquired"] != false || rs[1].(J)["reason"] != "quota" {
		t.Fatalf("results %v, want renewed and reason quota", rs)
	}
	if n := len(permits(t, ns)); n != 1 {
		t.Fatalf("%d permits, want 1", n)
	}
}

// An API server that does not answer is a 503 that names no address and no
// dial error, whoever asks.
func TestAPIServerNotAnsweringIs503WithoutDetail(t *testing.T) {
	gone := &rest.Config{Host: "http://127.0.0.1:1"}
	none, stopNone, err := env.StartRoute(gone, route.AuthNone, "default")
	if err != nil {
		t.Fatal(err)
	}
	defer stopNone()
	tok, stopTok, err := env.StartRoute(gone, route.AuthToken, "")
	if err != nil {
		t.Fatal(err)
	}
	defer stopTok()
	for _, c := range []struct{ url, token, want string }{
		{none, "", "send the same call again"},
		{tok, "some-token", "could not verify the token"},
	} {
		code, out := call(t, c.url, c.token, body("default", acquire("x", "o", 30, 0)))
		msg := errorOf(t, out)["message"].(string)
		if code != http.StatusServiceUnavailable || !strings.Contains(msg, c.want) {
			t.Fatalf("answered %d: %v", code, out)
		}
		for _, leak := range []string{"127.0.0.1", ":1", "dial", "connection refused", "http"} {
			if strings.Contains(msg, leak) {
				t.Fatalf("the message %q shows %q", msg, leak)
			}
		}
	}
}

func TestAuthNoneOnlyOnLoopback(t *testing.T) {
	for _, addr := range []string{":6632", "0.0.0.0:6632", "10.0.0.1:6632", "[::]:6632"} {
		_, err := route.New(route.Config{Addr: addr, Auth: route.AuthNone, DefaultNamespace: "default", REST: env.Config})
		if err == nil || !strings.Contains(err.Error(), "--route-address") || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("%s: %v", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:6632", "[::1]:6632", "localhost:6632"} {
		if _, err := route.New(route.Config{Addr: addr, Auth: route.AuthNone, DefaultNamespace: "default", REST: env.Config,
			Scheme: env.Client.Scheme(), Mapper: env.Client.RESTMapper()}); err != nil {
			t.Errorf("%s: %v", addr, err)
		}
	}
}

// Without token auth the route writes for whoever connects, so it answers
// loopback clients only: not a web page's POST (it carries Origin), nor a
// page that reached it under a name of its own (DNS rebinding: its Host).
func TestARouteWithoutAuthRefusesWebPages(t *testing.T) {
	ns := namespace(t)
	for _, c := range []struct {
		name    string
		headers map[string]string
		want    int
	}{
		{"a page's cross-site POST", map[string]string{"Origin": "http://evil.example", "Content-Type": "text/plain;charset=UTF-8"}, http.StatusForbidden},
		{"a rebound name", map[string]string{"Host": "evil.example:6632"}, http.StatusForbidden},
		{"a fetch marked cross-site", map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		{"localhost", map[string]string{"Host": "localhost:6632"}, http.StatusOK},
		{"an IPv6 loopback", map[string]string{"Host": "[::1]:6632"}, http.StatusOK},
		{"curl", nil, http.StatusOK},
	} {
		t.Run(c.name, func(t *testing.T) {
			lock := "page-" + strings.NewReplacer(" ", "-", "'", "").Replace(c.name)
			req, err := http.NewRequest(http.MethodPost, devURL, strings.NewReader(body(ns, acquire(lock, "o", 30, 0))))
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range c.headers {
				if k == "Host" {
					req.Host = v
				} else {
					req.Header.Set(k, v)
				}
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Fatalf("answered %d, want %d", resp.StatusCode, c.want)
			}
			stored := false
			for _, p := range permits(t, ns) {
				stored = stored || p.Spec.Lock == lock
			}
			if stored != (c.want == http.StatusOK) {
				t.Fatalf("permit stored: %v, with the call answered %d", stored, resp.StatusCode)
			}
		})
	}
}
