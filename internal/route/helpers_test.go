package route_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/route"
)

// J is a decoded JSON object.
type J = map[string]any

// call posts body to url with an optional bearer token and decodes the answer.
func call(t *testing.T, url, token, body string) (int, J) {
	t.Helper()
	var h http.Header
	if token != "" {
		h = bearer("Bearer", token)
	}
	resp, out := post(t, url, h, body)
	return resp.StatusCode, out
}

// bearer is an Authorization header with the given scheme.
func bearer(scheme, token string) http.Header {
	return http.Header{"Authorization": {scheme + " " + token}}
}

// post posts body to url with the given headers and decodes the answer.
func post(t *testing.T, url string, h http.Header, body string) (*http.Response, J) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out J
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&out); err != nil {
		t.Fatalf("answer %d is not JSON: %q", resp.StatusCode, raw)
	}
	return resp, out
}

// ops calls the dev route in ns with the given operations and answers the
// results, failing unless the call answered 200.
func ops(t *testing.T, ns string, operations ...string) []J {
	t.Helper()
	code, out := call(t, devURL, "", `{"namespace":"`+ns+`","operations":[`+strings.Join(operations, ",")+`]}`)
	if code != http.StatusOK {
		t.Fatalf("answer %d: %v", code, out)
	}
	rs := out["results"].([]any)
	res := make([]J, len(rs))
	for i, r := range rs {
		res[i] = r.(J)
	}
	return res
}

func one(t *testing.T, ns, op string) J { t.Helper(); return ops(t, ns, op)[0] }

func num(t *testing.T, v any) uint64 {
	t.Helper()
	n, ok := v.(json.Number)
	if !ok {
		t.Fatalf("%v (%T) is not a number", v, v)
	}
	u, err := n.Int64()
	if err != nil || u < 0 {
		t.Fatalf("%v is not a whole number", v)
	}
	return uint64(u)
}

func keys(m J) string {
	ks := slices.Sorted(maps.Keys(m))
	return strings.Join(ks, ",")
}

func namespace(t *testing.T) string {
	t.Helper()
	return env.Namespace(t, "route")
}

func permits(t *testing.T, ns string) []locksv1alpha1.QueenLock {
	t.Helper()
	var list locksv1alpha1.QueenLockList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// applyFile creates the objects of a YAML file of the repository, once.
func applyFile(t *testing.T, path string) {
	t.Helper()
	if err := env.ApplyFile(path); err != nil {
		t.Fatal(err)
	}
}

// serviceAccount makes a ServiceAccount in ns, binds it to the ClusterRole
// role there (none when role is empty) and answers a token of audience
// queen-locks for it.
func serviceAccount(t *testing.T, ns, name, role string) string {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := env.Client.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	if role != "" {
		bind(t, ns, name, "ClusterRole", role)
	}
	return token(t, ns, name, nil, route.Audience)
}

// bind binds the ServiceAccount ns/name to a Role or ClusterRole in ns,
// and answers the RoleBinding.
func bind(t *testing.T, ns, name, kind, role string) *rbacv1.RoleBinding {
	t.Helper()
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-" + role},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: kind, Name: role},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}},
	}
	if err := env.Client.Create(context.Background(), rb); err != nil {
		t.Fatal(err)
	}
	return rb
}

// token asks the API server for a token of the ServiceAccount ns/name with
// the given audiences (none: the API server's own), bound to pod when it is
// not nil, as the kubelet does for a projected token volume.
func token(t *testing.T, ns, name string, pod *corev1.Pod, audiences ...string) string {
	t.Helper()
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: audiences}}
	if pod != nil {
		tr.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := env.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name, tr, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}
