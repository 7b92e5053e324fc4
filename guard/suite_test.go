package guard_test

import (
	"context"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/route"
)

var env *controlplane.Env

func TestMain(m *testing.M) {
	os.Exit(controlplane.TestMain(m, controlplane.Options{}, func(e *controlplane.Env) { env = e }))
}

func namespace(t *testing.T) string {
	t.Helper()
	return env.Namespace(t, "guard")
}

func startRoute(t *testing.T, ns string) string {
	t.Helper()
	url, _ := env.ServeRoute(t, route.AuthNone, ns)
	return url
}

// hook is the guarded client's way to the API server: it counts every
// request, and lets a test act before a write of a ConfigMap is sent.
type hook struct {
	rt http.RoundTripper

	mu       sync.Mutex
	requests int
	writes   []string // "METHOD path" of each ConfigMap write sent
	before   func(r *http.Request)
	after    func(r *http.Request, resp *http.Response)
}

func (h *hook) RoundTrip(r *http.Request) (*http.Response, error) {
	h.mu.Lock()
	h.requests++
	write := r.Method != http.MethodGet && strings.Contains(r.URL.Path, "/configmaps")
	before, after := h.before, h.after
	if write {
		h.writes = append(h.writes, r.Method+" "+r.URL.Path)
	}
	h.mu.Unlock()
	if write && before != nil {
		before(r)
	}
	resp, err := h.rt.RoundTrip(r)
	if write && after != nil && err == nil {
		after(r, resp)
	}
	return resp, err
}

func (h *hook) count() (requests, writes int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.requests, len(h.writes)
}

func (h *hook) set(before func(*http.Request), after func(*http.Request, *http.Response)) {
	h.mu.Lock()
	h.before, h.after = before, after
	h.mu.Unlock()
}

// hookedClient is a client of a user allowed to write ConfigMaps and
// ServiceAccounts in ns, and no more (an administrator may delete a guarded
// object without a guard), whose requests all pass through a hook.
func hookedClient(t *testing.T, ns string) (client.Client, *hook) {
	t.Helper()
	ctx := context.Background()
	user := "writer"
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps", "serviceaccounts"}, Verbs: []string{"*"}}}}
	bind := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}}}
	for _, o := range []client.Object{role, bind} {
		if err := env.Client.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	h := &hook{}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { h.rt = rt; return h }
	c, err := client.New(cfg, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	// The authorizer learns of the grant from its informer: await it.
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return c.List(ctx, &corev1.ConfigMapList{}, client.InNamespace(ns)) == nil, nil
	})
	if err != nil {
		t.Fatalf("the grant to %s never took effect: %v", user, err)
	}
	return c, h
}

func configMap(ns, name, value string) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{Data: map[string]string{"report": value}}
	cm.Namespace, cm.Name = ns, name
	return cm
}

func storedConfigMap(t *testing.T, ns, name string) *corev1.ConfigMap {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, cm); err != nil {
		t.Fatal(err)
	}
	return cm
}
