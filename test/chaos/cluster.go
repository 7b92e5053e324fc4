package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/internal/skewclock"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/test/internal/loopback"
)

// cluster is the run's processes.
type cluster struct {
	env             *controlplane.Env
	etcd, apiserver *proc
	replicas        []*replica
	clients         []*proc
	rec             *recorder
	cs              kubernetes.Interface
	kubeconfig, dir string
	// tokenFile holds the clients' ServiceAccount token for the route,
	// with --auth=token; empty with --auth=none.
	tokenFile string
	// podTokens are the holder clients' tokens, each bound to the client's
	// pod, with --auth=token (see pods.go).
	podTokens []string
	podUIDs   []types.UID // the UID of each holder client's pod now
	// webhooks is where the API server calls the webhooks (the address
	// envtest configured): it spreads the calls over the replicas.
	webhooks *proxy
	// routes are each client's way to the route, spread over the
	// replicas; the last is the harness's own, never cut.
	routes []*proxy
	// hold keeps some of the clients' guarded writes inside
	// kube-apiserver after admission (hold.go).
	hold *hold
}

// replica is one manager process, with its own ports, its own way to the
// API server (a proxy the nemesis can cut) and its own clock offset.
type replica struct {
	id                     int
	p                      *proc
	webhookAddr, routeAddr string
	api                    *proxy
	clockFile              string
	starts                 int
}

// prepare finds etcd and kube-apiserver, writes the kubeconfig, makes the
// namespace and the guarded ConfigMap, and starts the manager.
func (c *cluster) prepare(ctx context.Context, cfg Config) error {
	var err error
	for _, p := range []struct {
		name string
		into **proc
	}{{"etcd", &c.etcd}, {"kube-apiserver", &c.apiserver}} {
		if *p.into, err = findChild(p.name); err != nil {
			return err
		}
		if (*p.into).log, err = os.Create(filepath.Join(c.dir, p.name+".log")); err != nil {
			return err
		}
	}
	c.kubeconfig = filepath.Join(c.dir, "kubeconfig")
	if err := os.WriteFile(c.kubeconfig, c.env.Env.KubeConfig, 0o600); err != nil {
		return err
	}
	if _, err := c.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := c.startReplicas(cfg); err != nil {
		return err
	}
	if err := c.grantClients(ctx); err != nil {
		return err
	}
	if cfg.Auth == route.AuthToken {
		if err := c.requestToken(ctx); err != nil {
			return err
		}
		if err := c.startPods(ctx, cfg.Clients); err != nil {
			return err
		}
	}
	if err := c.prepareGated(ctx, cfg); err != nil {
		return err
	}
	for _, r := range c.replicas {
		if err := c.startReplica(r); err != nil {
			return err
		}
	}
	// The guard webhooks see this create, which needs a guard of its own:
	// the manager must serve them, and the lock be held, first.
	rt := RouteTransport(c.harnessRoute(), Namespace, c.tokenFile)
	a, err := rt.Acquire(ctx, Lock, "setup", 60, 1)
	if err != nil || !a.Acquired {
		return fmt.Errorf("acquiring %s to create the guarded ConfigMap: %+v %v", Lock, a, err) //nolint:errorlint // err is nil when the call answered but did not acquire: %w would print %!w(<nil>)
	}
	g := permit.Guard{Lock: Lock, Token: a.Permit.Token}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: Object, Labels: map[string]string{permit.GuardedLabel: "true"},
			Annotations: map[string]string{permit.GuardAnnotation: g.String()}},
		Data: map[string]string{"counter": "0", "token": strconv.FormatUint(g.Token, 10), "writer": "setup"},
	}
	if _, err = c.cs.CoreV1().ConfigMaps(Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return err
	}
	if ok, err := rt.Release(ctx, Lock, 0, a.Permit.Token, "setup"); err != nil || !ok {
		return fmt.Errorf("releasing %s after creating the guarded ConfigMap: %v %v", Lock, ok, err) //nolint:errorlint // err is nil when the call answered but did not release: %w would print %!w(<nil>)
	}
	return nil
}

// ClientUser is the user the clients act as on the API server (the admin
// impersonates it): allowed everything on ConfigMaps and permits in the
// namespace, but not the guard's override, so its deletes and writes of the
// guarded object are judged like any namespace user's.
const ClientUser = "chaos-client"

func (c *cluster) grantClients(ctx context.Context) error {
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: ClientUser},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"*"}},
			{APIGroups: []string{locksv1alpha1.GroupVersion.Group}, Resources: []string{"queenlocks"}, Verbs: []string{"*"}},
		}}
	bind := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: ClientUser},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: ClientUser},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: ClientUser},
			{Kind: rbacv1.ServiceAccountKind, Namespace: Namespace, Name: ClientUser}}}
	if _, err := c.cs.RbacV1().Roles(Namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, err := c.cs.RbacV1().RoleBindings(Namespace).Create(ctx, bind, metav1.CreateOptions{})
	return err
}

// startReplicas sets up cfg.Replicas manager replicas (not started yet):
// each with a proxy to kube-apiserver and a kubeconfig through it, a clock
// offset file, and its own webhook and route ports; and the proxies in
// front of their webhooks (at the address the webhook configurations name)
// and, for the harness, of their routes.
func (c *cluster) startReplicas(cfg Config) error {
	wo := c.env.Env.WebhookInstallOptions
	server, err := url.Parse(c.env.Config.Host)
	if err != nil {
		return err
	}
	var webhooks, routes []string
	for i := 0; i < cfg.Replicas; i++ {
		r := &replica{id: i, clockFile: filepath.Join(c.dir, fmt.Sprintf("clock-%d", i))}
		if r.api, err = newProxy("127.0.0.1:0", server.Host); err != nil {
			return err
		}
		kc, err := clientcmd.Load(c.env.Env.KubeConfig)
		if err != nil {
			return err
		}
		for _, cl := range kc.Clusters {
			cl.Server = "https://" + r.api.addr()
		}
		if gatedOn(cfg) {
			asManager(kc) // the admission policies know the manager by its ServiceAccount
		}
		kubeconfig := filepath.Join(c.dir, fmt.Sprintf("kubeconfig-replica-%d", i))
		if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
			return err
		}
		// Clocks start apart, one ahead and the next behind by the full
		// skew; the nemesis changes them during the run.
		off := cfg.Skew
		if i%2 == 1 {
			off = -off
		}
		if err := skewclock.Write(r.clockFile, off); err != nil {
			return err
		}
		port, err := freePort()
		if err != nil {
			return err
		}
		r.webhookAddr = net.JoinHostPort(wo.LocalServingHost, strconv.Itoa(port))
		if r.routeAddr, err = loopback.FreeAddr(); err != nil {
			return err
		}
		r.p = &proc{name: fmt.Sprintf("manager %d", i), env: append(os.Environ(), "KUBECONFIG="+kubeconfig), args: append([]string{cfg.Manager,
			"--webhook-host", wo.LocalServingHost, "--webhook-port", strconv.Itoa(port), "--webhook-cert-dir", wo.LocalServingCertDir,
			"--route-address", r.routeAddr, "--auth", cfg.Auth, "--default-namespace", Namespace,
			"--leader-elect", "--leader-election-namespace", Namespace, "--expiry-grace", cfg.Grace.String(),
			"--metrics-bind-address", "0", "--health-probe-bind-address", "0",
			"--test-clock-offset-file", r.clockFile}, cfg.ManagerArgs...)}
		c.replicas = append(c.replicas, r)
		webhooks = append(webhooks, r.webhookAddr)
		routes = append(routes, r.routeAddr)
	}
	if c.webhooks, err = newProxy(net.JoinHostPort(wo.LocalServingHost, strconv.Itoa(wo.LocalServingPort)), webhooks...); err != nil {
		return err
	}
	for i := 0; i <= cfg.Clients+len(cfg.Roles); i++ {
		p, err := newProxy("127.0.0.1:0", routes...)
		if err != nil {
			return err
		}
		if i < cfg.Clients && cfg.DropAnswers > 0 {
			// The holders' answers are dropped now and then; the
			// misbehaving clients' and the harness's are not.
			rnd := rand.New(rand.NewPCG(cfg.Seed, uint64(i)))
			var mu sync.Mutex
			p.dropAnswer = func() bool {
				mu.Lock()
				defer mu.Unlock()
				return rnd.Float64() < cfg.DropAnswers
			}
		}
		c.routes = append(c.routes, p)
	}
	return nil
}

// droppedAnswers is how many answers the clients' proxies dropped.
func (c *cluster) droppedAnswers() int64 {
	var n int64
	for _, p := range c.routes {
		n += p.dropped.Load()
	}
	return n
}

// requestToken makes the ServiceAccount the clients call the route as and
// asks the API server for a token of it with the route's audience (a
// TokenRequest, as the kubelet does for a projected volume), good for a
// day: the route verifies it with a TokenReview and authorizes each
// operation with a SubjectAccessReview for that ServiceAccount.
func (c *cluster) requestToken(ctx context.Context) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: ClientUser}}
	if _, err := c.cs.CoreV1().ServiceAccounts(Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		return err
	}
	day := int64(24 * 3600)
	tr, err := c.cs.CoreV1().ServiceAccounts(Namespace).CreateToken(ctx, ClientUser, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{route.Audience}, ExpirationSeconds: &day}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("requesting a token of ServiceAccount %s for the route: %w", ClientUser, err)
	}
	c.tokenFile = filepath.Join(c.dir, "token")
	return os.WriteFile(c.tokenFile, []byte(tr.Status.Token), 0o600)
}

// routeURL is the lock route as client i reaches it; the harness's own
// after the last client.
func (c *cluster) routeURL(i int) string { return "http://" + c.routes[i].addr() + route.Path }

// harnessRoute is the harness's own way to the route, never cut.
func (c *cluster) harnessRoute() string { return c.routeURL(len(c.routes) - 1) }

// startReplica starts a manager replica and waits until its route and
// webhook server accept connections.
func (c *cluster) startReplica(r *replica) error {
	r.starts++
	name := fmt.Sprintf("manager-%d-%d.log", r.id, r.starts)
	log, err := os.Create(filepath.Join(c.dir, name))
	if err != nil {
		return err
	}
	r.p.log = log
	if err := r.p.start(); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for _, addr := range []string{r.routeAddr, r.webhookAddr} {
		for {
			conn, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				conn.Close()
				break
			}
			select {
			case <-r.p.proc.Done():
				return fmt.Errorf("manager %d exited; see %s", r.id, name)
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("manager %d does not listen on %s after a minute; see %s", r.id, addr, name)
			}
		}
	}
	return nil
}

// startReady starts etcd or kube-apiserver again and waits until the API
// server is ready.
func (c *cluster) startReady(p *proc) error {
	if err := p.start(); err != nil {
		return err
	}
	return c.waitReady()
}

// waitReady waits until kube-apiserver answers /readyz (which covers etcd).
func (c *cluster) waitReady() error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := c.cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver not ready after 2 minutes: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *cluster) listVersion(ctx context.Context) (uint64, error) {
	l, err := c.cs.CoreV1().ConfigMaps(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	return permit.Token(l.ResourceVersion)
}

// startClients starts one process per client, each logging its operations
// as JSON lines; closing a client's stdin asks it to stop.
func (c *cluster) startClients(cfg Config, logOp func(Op)) (*sync.WaitGroup, []*os.File, error) {
	var wg sync.WaitGroup
	var stops []*os.File
	for i := 0; i < cfg.Clients+len(cfg.Roles); i++ {
		role := RoleHolder
		if i >= cfg.Clients {
			role = cfg.Roles[i-cfg.Clients]
		}
		inR, inW, err := os.Pipe()
		if err != nil {
			return nil, nil, err
		}
		outR, outW, err := os.Pipe()
		if err != nil {
			return nil, nil, err
		}
		errLog, err := os.Create(filepath.Join(c.dir, fmt.Sprintf("client-%d.log", i)))
		if err != nil {
			return nil, nil, err
		}
		tokenFile := c.tokenFile
		if i < len(c.podTokens) {
			tokenFile = c.podTokens[i]
		}
		p := &proc{name: fmt.Sprintf("client %d (%s)", i, role), env: os.Environ(), log: errLog, stdin: inR, stdout: outW, args: []string{cfg.Self, "client",
			"-id", strconv.Itoa(i), "-route", c.routeURL(i), "-namespace", Namespace, "-lock", Lock, "-object", Object,
			"-ttl", strconv.FormatInt(cfg.TTL, 10), "-seed", strconv.FormatUint(cfg.Seed+uint64(i)+1, 10), "-kubeconfig", c.kubeconfig,
			"-role", role, "-other-lock", OtherLock, "-user", ClientUser, "-token-file", tokenFile}}
		if err := p.start(); err != nil {
			return nil, nil, err
		}
		inR.Close()
		outW.Close()
		c.clients = append(c.clients, p)
		stops = append(stops, inW)
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(outR)
			sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
			for sc.Scan() {
				if pod, ok := podOf(sc.Bytes()); ok {
					c.rec.pod(pod)
					continue
				}
				if hold, ok := holdOf(sc.Bytes()); ok {
					c.rec.hold(hold)
					continue
				}
				var op Op
				if json.Unmarshal(sc.Bytes(), &op) == nil {
					logOp(op)
				}
			}
		}()
	}
	return &wg, stops, nil
}

// shutdown stops what the run started: clients, manager, then the API
// server and etcd (the harness's own, when it restarted them; envtest's
// otherwise).
func (c *cluster) shutdown(logf func(string, ...any)) {
	for _, p := range c.clients {
		_ = p.signal(syscall.SIGCONT)
		_ = p.stop(10 * time.Second)
	}
	for _, r := range c.replicas {
		if r.p.proc != nil {
			_ = r.p.stop(30 * time.Second)
		}
		r.api.close()
	}
	for _, p := range append(c.routes, c.webhooks) {
		if p != nil {
			p.close()
		}
	}
	for _, p := range []*proc{c.apiserver, c.etcd} {
		if p != nil && p.proc != nil { // restarted by the harness
			if err := p.stop(time.Minute); err != nil {
				logf("stopping %s: %v", p.name, err)
			}
		}
	}
	if err := c.env.Stop(); err != nil {
		logf("stopping the control plane: %v", err)
	}
}

func freePort() (int, error) {
	addr, err := loopback.FreeAddr()
	if err != nil {
		return 0, err
	}
	_, port, _ := net.SplitHostPort(addr)
	return strconv.Atoi(port)
}
