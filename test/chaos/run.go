package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/permit"
)

// Names inside the run's control plane.
const (
	Namespace = "chaos"
	Lock      = "chaos"
	Object    = "chaos-object"
	// OtherLock is the second lock RoleOtherLock holds.
	OtherLock = "chaos-other"
	// Semaphore is the semaphore RoleSemaphore clients contend for, with
	// SemaphoreLimit slots.
	Semaphore      = "chaos-sem"
	SemaphoreLimit = 3
)

// CheckTimeout bounds the search for a linearization of a run's history.
const CheckTimeout = 5 * time.Minute

// Config is one run.
type Config struct {
	Duration time.Duration    // how long the nemesis acts
	Gap      [2]time.Duration // pause between faults, min and max
	Clients  int
	TTL      int64         // seconds
	Grace    time.Duration // the manager's --expiry-grace
	Replicas int           // manager replicas
	// Skew is the largest offset of a replica's clock from the machine's:
	// the nemesis sets each replica's offset within [-Skew, Skew].
	Skew time.Duration
	// ManagerArgs are more flags for every replica (a deliberate bug's, in
	// a chaosbug build).
	ManagerArgs []string
	// Auth is the route's --auth: route.AuthToken (the clients send a
	// ServiceAccount token of audience route.Audience, made with a
	// TokenRequest) or route.AuthNone.
	Auth string
	// DropAnswers is the share of the holder clients' route calls whose
	// answer the proxy drops after the replica carried the call out; the
	// client retries on another connection, which reaches the other
	// replica.
	DropAnswers float64
	Seed        uint64
	Manager     string   // the manager binary (bin/manager)
	Self        string   // this binary, run as "client" for each client
	Dir         string   // logs, kubeconfig and history.json
	Faults      []string // the kinds to inject, in turn
	Roles       []string // misbehaving clients, one process each, after the holders
	Logf        func(string, ...any)
}

// Result is a run's history, what the nemesis did and what the checks found.
type Result struct {
	History History
	Faults  map[string]int
	Report  Report
}

// Run starts the control plane, the manager and the clients, lets the
// nemesis act for cfg.Duration, stops the clients, records a final version
// that every watch must reach, and checks the history.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	rnd := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	if gatedOn(cfg) {
		cfg.ManagerArgs = append(cfg.ManagerArgs, "--gated-pods")
	}
	env, err := controlplane.Start(controlplane.Options{
		NoManager: true,
		// With gated clients: the pod webhook configuration, the admission
		// policies and the manager's pod rights of config/gate.
		GatedPods: gatedOn(cfg),
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
	if err := c.startHold(ctx, cfg.Seed); err != nil {
		return nil, fmt.Errorf("starting the hold webhook: %w", err)
	}
	defer c.stopHold()
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

	n := &nemesis{c: c, rand: rnd, faults: cfg.Faults, gap: cfg.Gap,
		pause: [2]time.Duration{time.Duration(cfg.TTL) * time.Second / 2, time.Duration(cfg.TTL)*time.Second + 2*time.Second},
		skew:  cfg.Skew, counts: map[string]int{}, logf: cfg.Logf}
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
	h := History{Grace: int64(cfg.Grace), Skew: int64(cfg.Skew), PodsGone: c.rec.pods, Outages: c.rec.outages, Ops: ops, Permits: c.rec.permits, SemPermits: c.rec.sem, Objects: c.rec.objects, Holds: c.rec.holds,
		Waiters: c.rec.waiters, Pods: c.rec.podInfos(), Leases: c.rec.leases,
		LeaderPermits: c.rec.leaderPermits, LeaderObjects: c.rec.leaderObjects}
	if raw, err := json.MarshalIndent(h, "", " "); err == nil {
		_ = os.WriteFile(filepath.Join(cfg.Dir, "history.json"), raw, 0o644)
	}
	n.counts[FaultDroppedAnswer] = int(c.droppedAnswers())
	n.counts[FaultHeld] = int(c.heldWrites())
	n.counts[FaultHungUp] = int(c.heldMinted())
	return &Result{History: h, Faults: n.counts, Report: Check(h, CheckTimeout)}, nil
}

// settle acquires the lock one last time, as client number cfg.Clients,
// writes under it, and waits until the watches have delivered both: every
// version before them has then been recorded.
func (c *cluster) settle(ctx context.Context, cfg Config, logOp func(Op)) error {
	kube, err := ClientKube(c.kubeconfig, ClientUser)
	if err != nil {
		return err
	}
	fc := &Client{ID: cfg.Clients + len(cfg.Roles), Route: RouteTransport(c.harnessRoute(), Namespace, c.tokenFile), Namespace: Namespace, Lock: Lock, Object: Object,
		TTL: 30, Kube: kube, Rand: rand.New(rand.NewPCG(1, 2)), Log: logOp}
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
	// The leaders have stopped: their permit and ConfigMap as they are now
	// are the last versions their watches must deliver.
	var leaderPermit, leaderObject uint64
	var lp locksv1alpha1.QueenLock
	if err := c.env.Client.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: permit.Name(LeaderLock, 0)}, &lp); err == nil {
		leaderPermit, _ = permit.Token(lp.ResourceVersion)
	}
	if lcm, err := c.cs.CoreV1().ConfigMaps(Namespace).Get(ctx, LeaderObject, metav1.GetOptions{}); err == nil {
		leaderObject, _ = permit.Token(lcm.ResourceVersion)
	}
	deadline = time.Now().Add(time.Minute)
	for !c.rec.seen(token, objectVersion) || !c.rec.seenLeaders(leaderPermit, leaderObject) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the watches did not reach permit version %d, ConfigMap version %d, leader permit version %d and leader ConfigMap version %d in a minute",
				token, objectVersion, leaderPermit, leaderObject)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// ClientREST is the client configuration from a kubeconfig file, acting as
// user when it is not empty, with timeouts that let a call outlive an API
// server restart.
func ClientREST(kubeconfig, user string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 25 * time.Second
	cfg.QPS, cfg.Burst = -1, 0
	if user != "" {
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	}
	return cfg, nil
}

// ClientKube is a clientset from a kubeconfig file, acting as user.
func ClientKube(kubeconfig, user string) (kubernetes.Interface, error) {
	cfg, err := ClientREST(kubeconfig, user)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// RouteTransport is the clients' way to the route at url: the handle's
// HTTP transport, with no kept-alive connections, so that a call to a
// killed manager fails as refused (certainly not applied) rather than on a
// dead pooled connection.
//
// With tokenFile set, every call carries the ServiceAccount token in it
// (the route runs with --auth=token).
func RouteTransport(url, namespace, tokenFile string) handle.Transport {
	return handle.HTTP(url, handle.HTTPOptions{Namespace: namespace, TokenFile: tokenFile,
		Client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}})
}
