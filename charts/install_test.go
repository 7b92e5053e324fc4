package charts

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/route"
)

func TestInstallIntoARealAPIServerAndKeepTheCRD(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a control plane")
	}
	e, err := controlplane.Start(controlplane.Options{Bare: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Stop() }()
	kc := writeKubeconfig(t, e)
	ctx := context.Background()
	helmIn := func(args ...string) string {
		return run(t, helm, append(args, "--kubeconfig", kc, "--namespace", "queen-locks")...)
	}
	// Gated pods on: the API server compiles the admission policies' CEL.
	helmIn("install", "queen-locks", chart, "--create-namespace", "--set", "gatedPods.enabled=true")
	// Every object of the release was accepted and is there.
	manifest := objects(t, helmIn("get", "manifest", "queen-locks"))
	if len(manifest) < 12 {
		t.Fatalf("only %d objects in the release", len(manifest))
	}
	for key, o := range manifest {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(o.GroupVersionKind())
		if err := e.Client.Get(ctx, client.ObjectKeyFromObject(o), got); err != nil {
			t.Errorf("%s: %v", key, err)
		}
	}
	crdKey := client.ObjectKey{Name: "queenlocks.locks.queen.dev"}
	crdExists := func() bool {
		crd := &unstructured.Unstructured{}
		crd.SetAPIVersion("apiextensions.k8s.io/v1")
		crd.SetKind("CustomResourceDefinition")
		err := e.Client.Get(ctx, crdKey, crd)
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	}
	helmIn("uninstall", "queen-locks")
	if !crdExists() {
		t.Fatal("uninstall removed the CRD")
	}
	// A permit made while no release is installed (no webhooks) survives a
	// second install and uninstall, which adopt and keep the CRD.
	p := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": locksv1alpha1.GroupVersion.String(), "kind": "QueenLock",
		"metadata": map[string]any{"name": "kept.0", "namespace": "queen-locks"},
		// No webhook stamps times here; the CRD's rules still want them.
		"spec": map[string]any{"lock": "kept", "slot": int64(0), "limit": int64(1), "owner": "o", "ttlSeconds": int64(3600),
			"acquireTime": "2026-12-02T10:00:00.000000Z", "renewTime": "2026-12-02T10:00:00.000000Z", "expireTime": "2026-12-02T11:00:00.000000Z"},
	}}
	if err := e.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	helmIn("install", "queen-locks", chart)
	helmIn("uninstall", "queen-locks")
	if !crdExists() {
		t.Fatal("the second uninstall removed the CRD")
	}
	if err := e.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
		t.Fatalf("the QueenLock did not survive uninstall: %v", err)
	}
}

// The manager, running as the chart's ServiceAccount with only the chart's
// RBAC, can do all it does: serve the webhooks and the route, elect a
// leader, expire permits and record events.
func TestTheChartRBACIsEnoughForTheManager(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a control plane")
	}
	ctx := context.Background()
	routeAddr := freeAddr(t)
	e, err := controlplane.Start(controlplane.Options{
		LeaderElectionNamespace: "queen-locks",
		ExpiryGrace:             100 * time.Millisecond,
		RouteAddr:               routeAddr,
		Auth:                    route.AuthToken,
		ManagerConfig: func(e *controlplane.Env) (*rest.Config, error) {
			if err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "queen-locks"}}); err != nil {
				return nil, err
			}
			for _, o := range render(t) {
				switch o.GetKind() {
				case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
					if err := e.Client.Create(ctx, o); err != nil {
						return nil, fmt.Errorf("%s/%s: %w", o.GetKind(), o.GetName(), err)
					}
				}
			}
			cfg := rest.CopyConfig(e.Config)
			cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:queen-locks:queen-locks"}
			return cfg, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Stop() }()
	// A workload allowed to hold locks in its namespace, through the route.
	ns := e.Namespace(t, "team")
	if err := e.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "job"}}); err != nil {
		t.Fatal(err)
	}
	if err := e.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "job-locks"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "queen-locks-holder"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "job", Namespace: ns}},
	}); err != nil {
		t.Fatal(err)
	}
	tr, err := e.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "job", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{route.Audience}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	call := func(op string) map[string]any {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+routeAddr+route.Path, strings.NewReader(`{"operations":[`+op+`]}`))
		req.Header.Set("Authorization", "Bearer "+tr.Status.Token)
		var resp *http.Response
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			var err error
			resp, err = http.DefaultClient.Do(req) //nolint:bodyclose // closed below, once the poll has ended
			return err == nil, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Results []map[string]any `json:"results"`
		}
		dec := json.NewDecoder(resp.Body)
		dec.UseNumber() // tokens are whole numbers; never print one as a float
		if err := dec.Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s answered %d: %v", op, resp.StatusCode, err)
		}
		return out.Results[0]
	}
	r := call(`{"op":"acquire","name":"short","ttlSeconds":1,"owner":"job"}`)
	if r["acquired"] != true {
		t.Fatalf("acquire %v", r)
	}
	r = call(fmt.Sprintf(`{"op":"renew","name":"short","token":%v,"owner":"job"}`, r["token"]))
	if r["renewed"] != true {
		t.Fatalf("renew %v", r)
	}
	// The elected manager expires it, with only the chart's rights.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		err := e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "short.0"}, &locksv1alpha1.QueenLock{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatal("the manager did not expire the permit under the chart's RBAC")
	}
	r = call(`{"op":"acquire","name":"long","ttlSeconds":60,"owner":"job"}`)
	if r["acquired"] != true {
		t.Fatalf("acquire %v", r)
	}
	if r = call(fmt.Sprintf(`{"op":"release","name":"long","token":%v,"owner":"job"}`, r["token"])); r["released"] != true {
		t.Fatalf("release %v", r)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
