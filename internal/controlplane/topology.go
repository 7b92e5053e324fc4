package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/queen-locks/queen-locks/internal/route"
)

// QuotaResource is what a ResourceQuota counts permits by.
const QuotaResource corev1.ResourceName = "count/queenlocks.locks.queen.dev"

// Topology is the way the chart runs the product, for one test: two route
// replicas (each its own server, with its own lock client and memory)
// behind one loopback address that sends each call to the next replica in
// turn, as a Service spreads new connections; token auth, the caller
// sending a projected ServiceAccount token of audience queen-locks bound to
// its pod; the locks in a namespace with a ResourceQuota on permits; and
// the caller's pod in another namespace than its locks. A behaviour tested
// only on one replica in one namespace cannot see a retry that reaches the
// other replica, a quota refusal or a pod looked for in the wrong place.
type Topology struct {
	// URL is the route behind the spreading proxy; Replicas are each
	// replica's own route, for sending a call to one of them on purpose.
	URL      string
	Replicas [2]string
	// LockNS holds the locks and the quota; PodNS holds the caller's pod
	// and its ServiceAccount, which holds the holder role in LockNS.
	LockNS, PodNS string
	// Pod is the caller's pod (an object only: no kubelet runs it).
	Pod *corev1.Pod
	// Token is the pod's projected token, also written to TokenFile.
	Token, TokenFile string
	// Quota is the ResourceQuota on permits in LockNS.
	Quota *corev1.ResourceQuota
	// Proxy spreads calls over the replicas at URL; its DropAnswers loses
	// answers on purpose.
	Proxy *Spreader
}

// TopologyOptions adjust a Topology.
type TopologyOptions struct {
	// Quota is the hard count of permits in LockNS (100 when 0).
	Quota int64
	// Prefix names the namespaces (topo when empty).
	Prefix string
	// Replica, when set, adjusts the route config of replica i (0 or 1)
	// before it starts: a transport that holds an answer of the API
	// server (REST.Wrap), a log to learn when a call ended.
	Replica func(i int, c *route.Config)
}

// Production builds a Topology for the test and tears it down when the
// test ends.
func (e *Env) Production(t T, o TopologyOptions) *Topology {
	t.Helper()
	if o.Quota == 0 {
		o.Quota = 100
	}
	if o.Prefix == "" {
		o.Prefix = "topo"
	}
	ctx := context.Background()
	if err := e.ApplyFile("config/rbac/holder_role.yaml"); err != nil {
		t.Fatal(err)
	}
	tp := &Topology{LockNS: e.Namespace(t, o.Prefix+"-locks"), PodNS: e.Namespace(t, o.Prefix+"-pods")}
	tp.Quota = e.SetQuota(t, tp.LockNS, o.Quota)

	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: tp.PodNS, Name: "runner"}}
	if err := e.Client.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: tp.LockNS, Name: "runner-holder"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "queen-locks-holder"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: tp.PodNS}},
	}
	if err := e.Client.Create(ctx, rb); err != nil {
		t.Fatal(err)
	}
	tp.Pod = e.Pod(t, tp.PodNS, "runner", sa.Name)
	tp.Token = e.PodToken(t, tp.Pod, route.Audience)
	tp.TokenFile = filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tp.TokenFile, []byte(tp.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range tp.Replicas {
		c := route.Config{Auth: route.AuthToken, DefaultNamespace: tp.LockNS, REST: rest.CopyConfig(e.Config)}
		if o.Replica != nil {
			o.Replica(i, &c)
		}
		url, stop, err := e.StartRouteConfig(c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		tp.Replicas[i] = url
	}
	tp.Proxy = Spread(t, tp.Replicas[:]...)
	tp.URL = tp.Proxy.URL
	return tp
}

// Pod makes a Pod object (no kubelet runs it) of ServiceAccount sa.
func (e *Env) Pod(t T, ns, name, sa string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{ServiceAccountName: sa, Containers: []corev1.Container{{Name: "job", Image: "job"}}}}
	if err := e.Client.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	return p
}

// PodToken is a token of the pod's ServiceAccount bound to the pod, with
// the given audiences, as the kubelet writes into a projected volume.
func (e *Env) PodToken(t T, p *corev1.Pod, audiences ...string) string {
	t.Helper()
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences:      audiences,
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
	}}
	sa := p.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tr, err := e.Clientset.CoreV1().ServiceAccounts(p.Namespace).CreateToken(context.Background(), sa, tr, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// SetQuota puts a ResourceQuota of hard permits on ns. No quota controller
// runs here, and without one the API server refuses every create until
// status.hard is filled in, so it is filled in as the controller would;
// the quota's admission then counts creates itself (and, with no
// controller, never counts a delete back).
func (e *Env) SetQuota(t T, ns string, hard int64) *corev1.ResourceQuota {
	t.Helper()
	ctx := context.Background()
	q := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "locks"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{QuotaResource: *resource.NewQuantity(hard, resource.DecimalSI)}},
	}
	if err := e.Client.Create(ctx, q); err != nil {
		t.Fatal(err)
	}
	q.Status = corev1.ResourceQuotaStatus{Hard: q.Spec.Hard, Used: corev1.ResourceList{QuotaResource: resource.MustParse("0")}}
	if err := e.Client.Status().Update(ctx, q); err != nil {
		t.Fatal(err)
	}
	return q
}

// ApplyFile creates the objects of a YAML file of the repository, leaving
// those that exist as they are.
func (e *Env) ApplyFile(path string) error {
	raw, err := os.ReadFile(filepath.Join(Root(), path))
	if err != nil {
		return err
	}
	for _, doc := range strings.Split(string(raw), "\n---") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		// kustomize's placeholder namespace is the manager's, as installed,
		// for the object and for the ServiceAccounts it binds.
		if u.GetNamespace() == "system" {
			u.SetNamespace(ManagerNamespace)
		}
		if subjects, ok := u.Object["subjects"].([]any); ok {
			for _, s := range subjects {
				if m, ok := s.(map[string]any); ok && m["namespace"] == "system" {
					m["namespace"] = ManagerNamespace
				}
			}
		}
		if err := e.Client.Create(context.Background(), u); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: creating %s %s: %w", path, u.GetKind(), u.GetName(), err)
		}
	}
	return nil
}

// Spreader is a loopback address in front of route replicas.
type Spreader struct {
	// URL is the route's URL at the spreader.
	URL string

	mu      sync.Mutex
	drop    []dropRule
	dropped int
}

// Dropped is how many answers were dropped so far.
func (s *Spreader) Dropped() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

type dropRule struct {
	match string
	left  int
}

// DropAnswers loses the answers of the next n calls whose body contains
// match: each reaches a replica, which carries it out and answers, and the
// caller's connection is cut before it reads a byte of that answer. Its
// retry, a call of its own, reaches the next replica.
func (s *Spreader) DropAnswers(match string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drop = append(s.drop, dropRule{match, n})
}

func (s *Spreader) dropping(body []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.drop {
		if s.drop[i].left > 0 && bytes.Contains(body, []byte(s.drop[i].match)) {
			s.drop[i].left--
			s.dropped++
			return true
		}
	}
	return false
}

type dropKey struct{}

// Spread serves one loopback address in front of the given route URLs and
// sends each call to the next of them in turn, on a connection of its own
// to that replica: so two calls in a row, a call and its retry, reach
// different replicas, whatever connection the caller reuses.
func Spread(t T, urls ...string) *Spreader {
	t.Helper()
	var targets []*url.URL
	for _, u := range urls {
		p, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		targets = append(targets, p)
	}
	sp := &Spreader{}
	var next atomic.Uint64
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			to := targets[(next.Add(1)-1)%uint64(len(targets))]
			r.SetURL(&url.URL{Scheme: to.Scheme, Host: to.Host})
			r.Out.URL.Path = r.In.URL.Path
			r.Out.Host = to.Host
		},
		Transport: &http.Transport{DisableKeepAlives: true},
		ModifyResponse: func(resp *http.Response) error {
			if resp.Request.Context().Value(dropKey{}) == nil {
				return nil
			}
			// The replica carried the call out and answered: read its
			// answer to the end, then cut the caller's connection.
			_, _ = io.Copy(io.Discard, resp.Body)
			return errDropped
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, errDropped) {
				if hj, ok := w.(http.Hijacker); ok {
					if conn, _, err := hj.Hijack(); err == nil {
						_ = conn.Close()
						return
					}
				}
			}
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if sp.dropping(body) {
			r = r.WithContext(context.WithValue(r.Context(), dropKey{}, true))
		}
		proxy.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: handler, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	sp.URL = "http://" + ln.Addr().String() + route.Path
	return sp
}

var errDropped = errors.New("answer dropped on purpose")

// ManagerNamespace and ManagerServiceAccount are where make dev runs the
// manager's identity, as the chart installs it.
const (
	ManagerNamespace      = "queen-locks"
	ManagerServiceAccount = "queen-locks-controller-manager"
)

// AsManagerServiceAccount is an Options.ManagerConfig that runs the manager
// as its own ServiceAccount with the RBAC config/rbac generates from the
// code (the chart's is the same, tested in charts/), never as the
// administrator kubectl uses: a write the manager may not make, or a rule
// that trusts the manager's identity, then shows as it would installed.
func AsManagerServiceAccount(e *Env) (*rest.Config, error) {
	ctx := context.Background()
	if err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ManagerNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	// The manager's rights as installed: its ClusterRole, and leader
	// election's Lease rights in its own namespace.
	for _, f := range []string{"config/rbac/role.yaml", "config/rbac/leader_election_role.yaml"} {
		if err := e.ApplyFile(f); err != nil {
			return nil, err
		}
	}
	objs := []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ManagerNamespace, Name: ManagerServiceAccount}},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "queen-locks-manager"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "queen-locks-manager"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: ManagerServiceAccount, Namespace: ManagerNamespace}},
		},
	}
	for _, o := range objs {
		if err := e.Client.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating %s: %w", o.GetName(), err)
		}
	}
	// A token of the ServiceAccount, as the manager's pod mounts one, rather
	// than the admin impersonating it: impersonation adds an authorization
	// of its own to every request, which the manager does not pay. It lasts
	// a year (the test API server sets no maximum), longer than any make
	// dev session.
	tr, err := e.Clientset.CoreV1().ServiceAccounts(ManagerNamespace).CreateToken(ctx, ManagerServiceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](365 * 24 * 3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("a token of the manager's ServiceAccount: %w", err)
	}
	cfg := rest.AnonymousClientConfig(e.Config)
	cfg.BearerToken = tr.Status.Token
	return cfg, nil
}
