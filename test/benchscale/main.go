// Command benchscale measures how queen-locks scales with many permits held
// by pods, spread over many namespaces: at each step of held permits, the
// manager's memory and the holder pods it follows, kube-apiserver's memory
// and open watches, expiry and pod-gone lag, the route's acquire latency,
// and how long a restarted manager takes to be ready, to lead, and to
// expire and free permits again. The manager runs as a process of its own
// (bin/manager), so that its memory is its own.
//
//	make bench-scale   # go run ./test/benchscale -manager bin/manager -out docs/development/benchmarks-scale.md
//	go run ./test/benchscale -manager bin/manager -steps 200,1000 -namespaces 100
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/test/internal/procfs"
	"github.com/queen-locks/queen-locks/test/internal/promtext"
)

// config is the run's flags.
type config struct {
	manager, out string
	steps        []int
	namespaces   int
	workers      int
	sample       int
	ttl          int64
	expiryTTL    int64
	grace        time.Duration
	stepTimeout  time.Duration
	minFree      int64 // bytes of MemAvailable below which no step starts
	saveMetrics  string
}

func main() {
	var c config
	steps := flag.String("steps", "1000,5000,10000,20000", "held permits at each step, ascending, comma-separated")
	flag.StringVar(&c.manager, "manager", "bin/manager", "the manager binary (make build)")
	flag.StringVar(&c.out, "out", "", "also write the report to this file")
	flag.IntVar(&c.namespaces, "namespaces", 1000, "namespaces the permits are spread over, evenly")
	flag.IntVar(&c.workers, "workers", 16, "concurrent creates of pods and permits")
	flag.IntVar(&c.sample, "sample", 200, "permits in each step's expiry, pod-gone and route samples")
	flag.Int64Var(&c.ttl, "ttl", 3600, "TTL in seconds of the held permits, never renewed: longer than the whole run, so none expires during it")
	flag.Int64Var(&c.expiryTTL, "expiry-ttl", 5, "TTL in seconds of the expiry sample's permits")
	flag.DurationVar(&c.grace, "grace", 2*time.Second, "the manager's --expiry-grace")
	flag.DurationVar(&c.stepTimeout, "step-timeout", 20*time.Minute, "longest a step may take; the run stops at a step that does not finish in time")
	minFree := flag.Int64("min-free-mib", 2048, "no step starts while the machine has less memory available (MemAvailable) than this, in MiB")
	flag.StringVar(&c.saveMetrics, "save-metrics", "", "write kube-apiserver's /metrics text, scraped once the first step has settled, here")
	flag.Parse()
	c.minFree = *minFree << 20
	var err error
	if c.steps, err = parseSteps(*steps); err != nil {
		fmt.Fprintln(os.Stderr, "bench-scale: -steps:", err)
		os.Exit(2)
	}
	os.Exit(runSignalled(c))
}

// runSignalled is run, ended early by SIGINT or SIGTERM.
func runSignalled(c config) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := run(ctx, c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-scale:", err)
	}
	return code
}

// parseSteps reads "1000,5000,10000": positive and ascending.
func parseSteps(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive count", f)
		}
		if len(out) > 0 && n <= out[len(out)-1] {
			return nil, fmt.Errorf("steps must ascend: %d after %d", n, out[len(out)-1])
		}
		out = append(out, n)
	}
	return out, nil
}

// scale is one run: the control plane, the manager, the fleet of held
// permits and the watch that times deletes.
type scale struct {
	cfg    config
	env    *controlplane.Env
	cs     kubernetes.Interface // admin, no client-side rate limit
	f      *fleet
	del    *deletes
	mgr    *managerProc
	apiPID int
	// podWatchBase is kube-apiserver's open pod watches with the manager
	// leading and no holder pod followed: its cache's watch of gated pods.
	podWatchBase float64
	grace        time.Duration
}

// run sets up, runs the steps and writes the report. Its exit code is 0
// when the report was written, also when a step could not be reached for
// time or memory (the report says so); 1 when the run failed otherwise.
func run(ctx context.Context, c config) (int, error) {
	if _, err := os.Stat(c.manager); err != nil {
		return 1, fmt.Errorf("the manager binary (make build): %w", err)
	}
	rep := &report{cfg: c, started: time.Now(), loadBefore: procfs.LoadAvg(), memTotal: procfs.Meminfo("MemTotal:")}
	env, err := controlplane.Start(controlplane.Options{NoManager: true})
	if err != nil {
		return 1, err
	}
	s := &scale{cfg: c, env: env, grace: c.grace}
	dir, err := os.MkdirTemp("", "benchscale-")
	if err != nil {
		_ = env.Stop()
		return 1, err
	}
	failed := true
	// The benchmark's own watch ends with runCtx: kube-apiserver waits for
	// open watches to end before it stops.
	runCtx, cancelRun := context.WithCancel(ctx)
	defer func() {
		cancelRun()
		if s.del != nil {
			<-s.del.done
		}
		// The manager, then the control plane it needs to stop cleanly;
		// its log is kept when the run failed.
		if s.mgr != nil {
			if _, err := s.mgr.stop(time.Minute); err != nil {
				fmt.Fprintln(os.Stderr, "stopping the manager:", err)
			}
		}
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the control plane:", err)
		}
		if failed {
			fmt.Fprintln(os.Stderr, "the manager's log is in", dir)
		} else {
			os.RemoveAll(dir)
		}
	}()

	ctx = runCtx
	if err := s.setup(ctx, dir, rep); err != nil {
		return 1, err
	}
	code := 0
	for _, n := range c.steps {
		if avail := procfs.Meminfo("MemAvailable:"); avail >= 0 && avail < c.minFree {
			rep.stopped = fmt.Sprintf("Stopped before the %d step: the machine had %s available, under the %s the run keeps free (-min-free-mib).", n, mib(avail), mib(c.minFree))
			break
		}
		fmt.Fprintf(os.Stderr, "step %d: growing to %d held permits\n", len(rep.rows)+1, n)
		sctx, cancel := context.WithTimeout(ctx, c.stepTimeout)
		r, err := s.step(sctx, n)
		cancel()
		if err != nil {
			switch {
			case ctx.Err() != nil:
				rep.stopped = fmt.Sprintf("Stopped during the %d step: the run was interrupted.", n)
				code = 1
			case errors.Is(err, context.DeadlineExceeded):
				rep.stopped = fmt.Sprintf("Stopped at the %d step: it did not finish within %s (-step-timeout): %v.", n, c.stepTimeout, err)
			default:
				rep.stopped = fmt.Sprintf("Stopped at the %d step: %v.", n, err)
				code = 1
			}
			fmt.Fprintln(os.Stderr, rep.stopped)
			break
		}
		rep.rows = append(rep.rows, r)
		fmt.Fprintf(os.Stderr, "step %d done in %s:\n%s\n", len(rep.rows), dur(r.took), r.summary())
	}
	rep.loadAfter = procfs.LoadAvg()
	rep.finished = time.Now()
	text := rep.markdown()
	fmt.Print(text)
	if c.out != "" {
		if err := os.WriteFile(c.out, []byte(text), 0o644); err != nil {
			return 1, err
		}
	}
	failed = code != 0
	return code, nil
}

// setup makes the clients, the namespaces, the watch, and starts the
// manager.
func (s *scale) setup(ctx context.Context, dir string, rep *report) error {
	// Every client of the benchmark without a client-side rate limit.
	cfg := rest.CopyConfig(s.env.Config)
	cfg.QPS, cfg.Burst = -1, 0
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	s.cs = cs
	c, err := client.New(cfg, client.Options{Scheme: manager.Scheme})
	if err != nil {
		return err
	}
	// Permits are taken as the manager's ServiceAccount, as the route
	// takes them for the callers it verified: the webhook admits a
	// holderPod only from the pod it names or from the manager.
	if _, err := controlplane.AsManagerServiceAccount(s.env); err != nil {
		return fmt.Errorf("the manager's ServiceAccount: %w", err)
	}
	asManager := rest.CopyConfig(cfg)
	asManager.Impersonate = rest.ImpersonationConfig{UserName: managerUser}
	mc, err := client.New(asManager, client.Options{Scheme: manager.Scheme})
	if err != nil {
		return err
	}
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if v, err := cs.Discovery().ServerVersion(); err == nil {
		rep.apiVersion = v.GitVersion
	}
	cp := s.env.Env.ControlPlane
	procs, err := procfs.Find(cp.APIServer.CertDir, cp.Etcd.DataDir)
	if err != nil {
		return err
	}
	s.apiPID = procs.APIServer
	s.f = &fleet{cs: cs, c: c, locks: locks.New(mc, nil), nNS: s.cfg.namespaces, workers: s.cfg.workers, ttl: s.cfg.ttl}
	t0 := time.Now()
	if err := s.f.makeNamespaces(ctx); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%d namespaces in %s\n", s.cfg.namespaces, dur(time.Since(t0)))
	if s.del, err = watchDeletes(ctx, meta); err != nil {
		return err
	}
	if s.mgr, err = newManager(s.env, s.cfg.manager, dir, s.grace); err != nil {
		return err
	}
	if err := s.mgr.start(); err != nil {
		return err
	}
	err = s.until(ctx, 2*time.Minute, "the manager to be ready and lead", func() (bool, error) {
		if !s.mgr.ready(ctx) {
			return false, nil
		}
		mm, err := s.mgr.metrics(ctx)
		return err == nil && mm.leader, nil
	})
	if err != nil {
		return err
	}
	// The manager's own pod watch (its cache's, of gated pods), before any
	// holder pod: the watches counted against the namespaces watched are
	// those above it. It opens a moment after the manager leads.
	deadline := time.Now().Add(10 * time.Second)
	for s.podWatchBase < 1 && time.Now().Before(deadline) {
		if w, err := apiserverWatches(ctx, s.cs); err == nil {
			s.podWatchBase = w["pods"]
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}

// until polls cond every 200 ms until it holds, for at most d.
func (s *scale) until(ctx context.Context, d time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(d)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if s.mgr.exited() {
			return fmt.Errorf("waiting for %s: the manager exited; see its log", what)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s: not within %s", what, d)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// step grows the fleet to n held permits and measures.
func (s *scale) step(ctx context.Context, n int) (row, error) {
	start := time.Now()
	r := row{held: n, namespaces: min(n, s.cfg.namespaces), load: procfs.LoadAvg()}
	from := len(s.f.held)
	if err := s.f.grow(ctx, n); err != nil {
		return r, fmt.Errorf("creating pods and permits: %w", err)
	}
	r.create = time.Since(start)
	r.createRate = float64(n-from) / r.create.Seconds()

	// Settled: the leader follows every holder pod, and kube-apiserver has
	// as many pod watches open.
	t0 := time.Now()
	var mm managerMetrics
	var watches map[string]float64
	spaces := float64(r.namespaces)
	err := s.until(ctx, s.cfg.stepTimeout, fmt.Sprintf("the manager to follow %d holder pods in %d namespaces", n, r.namespaces), func() (bool, error) {
		var err error
		if mm, err = s.mgr.metrics(ctx); err != nil || !mm.leader || mm.followed < float64(n) || mm.named < float64(n) || mm.watched < spaces {
			return false, nil
		}
		if watches, err = apiserverWatches(ctx, s.cs); err != nil {
			return false, nil
		}
		return watches["pods"] >= s.podWatchBase+mm.watched, nil
	})
	if err != nil {
		return r, err
	}
	r.settle = time.Since(t0)
	// A moment for the watches' buffers and goroutines to be in place.
	time.Sleep(2 * time.Second)
	if mm, err = s.mgr.metrics(ctx); err != nil {
		return r, err
	}
	r.mgrRSS, r.mgrHeap, r.apiRSS = procfs.RSS(strconv.Itoa(s.mgr.pid)), mm.heapInUse, procfs.RSS(strconv.Itoa(s.apiPID))
	r.followed, r.watched, r.holderPodErrors = mm.followed, mm.watched, mm.holderPodErrors
	raw, err := scrapeAPIServer(ctx, s.cs)
	if err != nil {
		return r, err
	}
	if s.cfg.saveMetrics != "" && len(s.f.held) == s.cfg.steps[0] {
		if err := os.WriteFile(s.cfg.saveMetrics, raw, 0o644); err != nil {
			return r, err
		}
	}
	if r.watches, err = watchesOf(raw); err != nil {
		return r, err
	}
	fmt.Fprintf(os.Stderr, "  settled in %s: manager RSS %s, heap %s, kube-apiserver RSS %s, pod watches %.0f\n",
		dur(r.settle), mib(r.mgrRSS), mib(r.mgrHeap), mib(r.apiRSS), r.watches["pods"])

	if r.expiry, err = s.expiryLag(ctx, n, s.cfg.sample, s.cfg.expiryTTL); err != nil {
		return r, fmt.Errorf("expiry lag: %w", err)
	}
	fmt.Fprintf(os.Stderr, "  expiry lag %s\n", r.expiry)
	if r.podGone, err = s.podGoneLag(ctx, s.cfg.sample); err != nil {
		return r, fmt.Errorf("pod-gone lag: %w", err)
	}
	fmt.Fprintf(os.Stderr, "  pod-gone lag %s\n", r.podGone)
	if r.route, err = s.routeAcquires(ctx, n, s.cfg.sample); err != nil {
		return r, fmt.Errorf("route acquires: %w", err)
	}
	fmt.Fprintf(os.Stderr, "  route acquire %s\n", r.route)
	if r.restart, err = s.restartManager(ctx, n); err != nil {
		return r, fmt.Errorf("manager restart: %w", err)
	}
	r.took = time.Since(start)
	return r, nil
}

func watchesOf(raw []byte) (map[string]float64, error) {
	s, err := promtext.Parse(strings.NewReader(string(raw)), longRunning)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver's /metrics: %w", err)
	}
	return watchesByResource(s), nil
}

// flagLine is the run's flags as a command line, without the paths.
func (c config) flagLine() string {
	steps := make([]string, len(c.steps))
	for i, n := range c.steps {
		steps[i] = strconv.Itoa(n)
	}
	return strings.Join(slices.Concat([]string{
		"-steps " + strings.Join(steps, ","),
		fmt.Sprintf("-namespaces %d", c.namespaces),
		fmt.Sprintf("-workers %d", c.workers),
		fmt.Sprintf("-sample %d", c.sample),
		fmt.Sprintf("-ttl %d", c.ttl),
		fmt.Sprintf("-expiry-ttl %d", c.expiryTTL),
		"-grace " + c.grace.String(),
		"-step-timeout " + c.stepTimeout.String(),
		fmt.Sprintf("-min-free-mib %d", c.minFree>>20),
	}), " ")
}
