package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/manager"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/route"
)

// Names inside the run's control plane.
const (
	Namespace = "chaos"
	Lock      = "chaos"
	Object    = "chaos-object"
)

// Config is one run.
type Config struct {
	Duration time.Duration // how long the nemesis acts
	Clients  int
	TTL      int64 // seconds
	Seed     uint64
	Manager  string   // the manager binary (bin/manager)
	Self     string   // this binary, run as "client" for each client
	Dir      string   // logs, kubeconfig and history.json
	Faults   []string // the kinds to inject, in turn
	Logf     func(string, ...any)
}

// Result is a run's history, what the nemesis did and what the checks found.
type Result struct {
	History History
	Faults  map[string]int
	Report  Report
}

// cluster is the run's processes.
type cluster struct {
	env                *controlplane.Env
	etcd, apiserver    *proc
	manager            *proc
	clients            []*proc
	rec                *recorder
	cs                 kubernetes.Interface
	routeAddr, webhook string
	kubeconfig, dir    string
	starts             int
}

// Run starts the control plane, the manager and the clients, lets the
// nemesis act for cfg.Duration, stops the clients, records a final version
// that every watch must reach, and checks the history.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	rnd := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	env, err := controlplane.Start(controlplane.Options{
		NoManager: true,
		// Watches go to etcd itself, which can replay every version after
		// any other: a restarted API server's watch cache could not.
		APIServerFlags: map[string]string{"watch-cache": "false", "etcd-compaction-interval": "0"},
	})
	if err != nil {
		return nil, err
	}
	c := &cluster{env: env, cs: env.Clientset, dir: cfg.Dir, rec: &recorder{}}
	defer c.shutdown(cfg.Logf)
	if err := c.prepare(ctx, cfg); err != nil {
		return nil, err
	}
	from, err := c.listVersion(ctx)
	if err != nil {
		return nil, err
	}
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: manager.Scheme})
	if err != nil {
		return nil, err
	}
	recCtx, stopRec := context.WithCancel(ctx)
	recDone := make(chan struct{})
	go func() {
		c.rec.run(recCtx, wc, c.cs, Namespace, permit.Name(Lock, 0), Object, from)
		close(recDone)
	}()
	defer func() { stopRec(); <-recDone }()

	var mu sync.Mutex
	var ops []Op
	logOp := func(op Op) { mu.Lock(); ops = append(ops, op); mu.Unlock() }
	readers, stops, err := c.startClients(cfg, logOp)
	if err != nil {
		return nil, err
	}

	n := &nemesis{c: c, rand: rnd, faults: cfg.Faults, gap: [2]time.Duration{2 * time.Second, 5 * time.Second},
		pause:  [2]time.Duration{time.Duration(cfg.TTL) * time.Second / 2, time.Duration(cfg.TTL)*time.Second + 2*time.Second},
		counts: map[string]int{}, logf: cfg.Logf}
	nctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	nerr := n.run(nctx)
	cancel()
	if nerr != nil {
		return nil, fmt.Errorf("the nemesis failed: %w", nerr)
	}
	cfg.Logf("stopping the clients")
	for _, s := range stops {
		_ = s.Close()
	}
	for _, p := range c.clients {
		if err := p.wait(time.Minute); err != nil {
			_ = p.kill()
		}
	}
	readers.Wait()

	cfg.Logf("final acquire and write, then waiting for the watches")
	if err := c.settle(ctx, cfg, logOp); err != nil {
		return nil, err
	}
	stopRec()
	<-recDone
	if c.rec.err != nil {
		return nil, c.rec.err
	}
	h := History{Ops: ops, Permits: c.rec.permits, Objects: c.rec.objects}
	if raw, err := json.MarshalIndent(h, "", " "); err == nil {
		_ = os.WriteFile(filepath.Join(cfg.Dir, "history.json"), raw, 0o644)
	}
	return &Result{History: h, Faults: n.counts, Report: Check(h, 5*time.Minute)}, nil
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
	if c.routeAddr, err = freeAddr(); err != nil {
		return err
	}
	wo := c.env.Env.WebhookInstallOptions
	c.webhook = net.JoinHostPort(wo.LocalServingHost, strconv.Itoa(wo.LocalServingPort))
	c.manager = &proc{name: "manager", env: append(os.Environ(), "KUBECONFIG="+c.kubeconfig), args: []string{cfg.Manager,
		"--webhook-host", wo.LocalServingHost, "--webhook-port", strconv.Itoa(wo.LocalServingPort), "--webhook-cert-dir", wo.LocalServingCertDir,
		"--route-address", c.routeAddr, "--auth", route.AuthNone, "--default-namespace", Namespace,
		"--leader-elect", "--leader-election-namespace", Namespace,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0"}}
	if err := c.startManager(); err != nil {
		return err
	}
	// The guard webhooks see this create: the manager must serve them first.
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: Object, Labels: map[string]string{permit.GuardedLabel: "true"}},
		Data:       map[string]string{"counter": "0"},
	}
	_, err = c.cs.CoreV1().ConfigMaps(Namespace).Create(ctx, cm, metav1.CreateOptions{})
	return err
}

// startManager starts the manager process and waits until its route and
// webhook server accept connections.
func (c *cluster) startManager() error {
	c.starts++
	log, err := os.Create(filepath.Join(c.dir, fmt.Sprintf("manager-%d.log", c.starts)))
	if err != nil {
		return err
	}
	c.manager.log = log
	if err := c.manager.start(); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for _, addr := range []string{c.routeAddr, c.webhook} {
		for {
			conn, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				conn.Close()
				break
			}
			select {
			case <-c.manager.done:
				return fmt.Errorf("the manager exited; see manager-%d.log", c.starts)
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the manager does not listen on %s after a minute; see manager-%d.log", addr, c.starts)
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
	for i := 0; i < cfg.Clients; i++ {
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
		p := &proc{name: fmt.Sprintf("client %d", i), env: os.Environ(), log: errLog, stdin: inR, stdout: outW, args: []string{cfg.Self, "client",
			"-id", strconv.Itoa(i), "-route", "http://" + c.routeAddr + route.Path, "-namespace", Namespace, "-lock", Lock, "-object", Object,
			"-ttl", strconv.FormatInt(cfg.TTL, 10), "-seed", strconv.FormatUint(cfg.Seed+uint64(i)+1, 10), "-kubeconfig", c.kubeconfig}}
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
				var op Op
				if json.Unmarshal(sc.Bytes(), &op) == nil {
					logOp(op)
				}
			}
		}()
	}
	return &wg, stops, nil
}

// settle acquires the lock one last time, as client number cfg.Clients,
// writes under it, and waits until the watches have delivered both: every
// version before them has then been recorded.
func (c *cluster) settle(ctx context.Context, cfg Config, logOp func(Op)) error {
	kube, err := ClientKube(c.kubeconfig)
	if err != nil {
		return err
	}
	fc := &Client{ID: cfg.Clients, RouteURL: "http://" + c.routeAddr + route.Path, Namespace: Namespace, Lock: Lock, Object: Object,
		TTL: 30, Kube: kube, HTTP: RouteHTTP(), Rand: rand.New(rand.NewPCG(1, 2)), Log: logOp}
	deadline := time.Now().Add(2 * time.Minute)
	var token uint64
	for {
		op := fc.call(ctx, Op{Kind: KindAcquire, Owner: "final", TTL: fc.TTL})
		if op.Outcome == Acquired || op.Outcome == Already {
			token = op.NewToken
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the final acquire did not win in 2 minutes: last %s", op)
		}
		time.Sleep(200 * time.Millisecond)
	}
	fc.write(ctx, "final", token)
	cm, err := c.cs.CoreV1().ConfigMaps(Namespace).Get(ctx, Object, metav1.GetOptions{})
	if err != nil {
		return err
	}
	objectVersion, err := permit.Token(cm.ResourceVersion)
	if err != nil {
		return err
	}
	deadline = time.Now().Add(time.Minute)
	for !c.rec.seen(token, objectVersion) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the watches did not reach permit version %d and ConfigMap version %d in a minute", token, objectVersion)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// shutdown stops what the run started: clients, manager, then the API
// server and etcd (the harness's own, when it restarted them; envtest's
// otherwise).
func (c *cluster) shutdown(logf func(string, ...any)) {
	for _, p := range c.clients {
		_ = p.signal(syscall.SIGCONT)
		_ = p.stop(10 * time.Second)
	}
	if c.manager != nil && c.manager.done != nil {
		_ = c.manager.stop(30 * time.Second)
	}
	for _, p := range []*proc{c.apiserver, c.etcd} {
		if p != nil && p.done != nil { // restarted by the harness
			if err := p.stop(time.Minute); err != nil {
				logf("stopping %s: %v", p.name, err)
			}
		}
	}
	if err := c.env.Stop(); err != nil {
		logf("stopping the control plane: %v", err)
	}
}

// ClientKube is a clientset from a kubeconfig file, with timeouts that let
// a call outlive an API server restart.
func ClientKube(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	return newKube(cfg)
}

func newKube(cfg *rest.Config) (kubernetes.Interface, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = 25 * time.Second
	cfg.QPS, cfg.Burst = -1, 0
	return kubernetes.NewForConfig(cfg)
}

// RouteHTTP is the clients' HTTP client for the route: no kept-alive
// connections, so a call to a killed manager fails as refused (certainly
// not applied) rather than on a dead pooled connection.
func RouteHTTP() *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
