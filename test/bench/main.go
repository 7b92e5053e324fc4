// Command bench measures queen-locks on the local control plane, side by
// side with a baseline measured in the same run: plain coordination.k8s.io
// Lease create+delete with client-go against the same API server (the same
// etcd writes, without the webhooks and the route). It prints a markdown
// table and writes it to docs/development/benchmarks.md.
//
//	make bench                      # go run ./test/bench -out docs/development/benchmarks.md
//	go run ./test/bench -duration 20s    # longer throughput rows
//	go run ./test/bench -profile DIR     # CPU profiles of the route and kube-apiserver at 8 clients
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/test/internal/procfs"
)

func main() {
	duration := flag.Duration("duration", 10*time.Second, "how long each throughput row runs, in one-second rounds")
	out := flag.String("out", "", "also write the report to this file")
	permits := flag.Int("permits", 10000, "held permits for the memory row")
	only := flag.String("sections", "", "run only these sections, comma-separated: calls, cycles, external, batch, bound, renew, election, memory, wakeup, line, gated, dashboard")
	calls := flag.Int("calls", 40, "operations of each kind whose API calls are counted")
	flag.StringVar(&saveMetrics, "save-metrics", "", "write kube-apiserver's last scraped /metrics text here")
	flag.StringVar(&featureGates, "apiserver-feature-gates", "", "kube-apiserver's --feature-gates, for trying one (CBORServingAndStorage=true, say)")
	flag.IntVar(&renewMax, "renew-max", renewSteps[len(renewSteps)-1], "the largest step of the renew load")
	clients := flag.Bool("client", false, "run as the external clients' process, which the bench starts itself (see external.go)")
	flag.StringVar(&profileDir, "profile", "", "write CPU profiles here: the Lease baseline, the CRD copy and the route (no auth) at 8 clients, the route with and without token auth at 32: this process (route, webhooks, clients) and kube-apiserver")
	flag.Parse()
	if *clients {
		runClientsMain()
		return
	}
	if err := run(*duration, *out, *permits, *calls, splitList(*only)); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// cycle is one unit of work of a worker; it answers an error to stop.
type cycle func(ctx context.Context, worker, i int) error

type result struct {
	name   string
	conc   int
	cycles int
	secs   float64
	p50    time.Duration
	p99    time.Duration
	cpu    cpuTimes
}

func (r result) rate() float64 { return float64(r.cycles) / r.secs }

// measure runs conc workers doing c for d and collects per-cycle latencies.
func measure(name string, conc int, d time.Duration, c cycle) (result, []time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	for w := range conc {
		wg.Go(func() {
			var mine []time.Duration
			for i := 0; ctx.Err() == nil; i++ {
				t0 := time.Now()
				if err := c(context.Background(), w, i); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("%s: %w", name, err)
					}
					mu.Unlock()
					cancel()
					break
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	r := result{name: name, conc: conc, cycles: len(lat), secs: time.Since(start).Seconds()}
	r.p50, r.p99 = percentile(lat, 50), percentile(lat, 99)
	return r, lat, firstErr
}

// path is one way of doing a cycle, measured against the others.
type path struct {
	name string
	c    cycle
}

// interleave measures each path for d at conc workers, in rounds of a
// second, taking the paths in turn within each round: the load of the
// other engineers' work on this shared machine comes and goes, and taking
// turns spreads it over all paths alike, so that their ratios hold.
func interleave(paths []path, conc int, d time.Duration, p procs, idle cpuTimes) ([]result, error) {
	rounds := max(1, int(d/time.Second))
	out := make([]result, len(paths))
	lats := make([][]time.Duration, len(paths))
	for range rounds {
		for i, pt := range paths {
			before := p.times()
			r, lat, err := measure(pt.name, conc, d/time.Duration(rounds), pt.c)
			if err != nil {
				return nil, err
			}
			out[i].cpu = out[i].cpu.plus(p.times().minus(before).aboveIdle(idle, r.secs))
			out[i].name, out[i].conc = pt.name, conc
			out[i].cycles += r.cycles
			out[i].secs += r.secs
			lats[i] = append(lats[i], lat...)
		}
	}
	for i := range out {
		out[i].p50, out[i].p99 = percentile(lats[i], 50), percentile(lats[i], 99)
	}
	return out, nil
}

func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[min(len(d)-1, len(d)*p/100)]
}

// renewSteps are the held-permit counts of the renew load; it stops at the
// first whose p99 passes renewBound.
var renewSteps = []int{250, 1000, 2000, 3000, 4000, 6000, 8000, 12000, 16000}

const renewBound = 250 * time.Millisecond

// featureGates are kube-apiserver's --feature-gates (-apiserver-feature-gates).
var featureGates string

// renewMax cuts the renew steps short (-renew-max), for a quick try.
var renewMax int

// routeClient is the HTTP client of every route transport. Each real
// caller is its own process with its own kept-alive connection; one shared
// client with Go's default of two idle connections per host would instead
// open and close a connection for most calls at 8 clients and more, and
// measure that.
var routeClient = &http.Client{Timeout: 30 * time.Second, Transport: func() http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 1024
	return t
}()}

// bench is one run: the control plane, the ways of reaching the locks,
// and the report being written.
type bench struct {
	env      *controlplane.Env
	procs    procs                // the control plane's processes
	idle     cpuTimes             // what they use per second while nothing runs
	cfg      *rest.Config         // admin, no client-side rate limit
	cs       kubernetes.Interface // over cfg
	d        time.Duration
	nPermits int
	nCalls   int
	noneURL  string
	httpT    handle.Transport   // the route without auth
	tokenT   []handle.Transport // the route with token auth, one ServiceAccount each
	kubeT    handle.Transport   // the direct transport
	b        strings.Builder
	sum      summary // what the targets section says
}

// summary is what the run found against the targets the benchmark is
// held to (summary.go names them).
type summary struct {
	callsRun     bool
	callsOff     []string        // operations whose lock calls missed the target
	ratio8       float64         // the route without auth at 8 clients, to the Lease
	floor8       float64         // the CRD copy at 8 clients, to the Lease
	tokenVs      map[int]float64 // the route with token auth to without, by clients
	tokenSteady  map[int]float64 // the same, with only the two route paths in turn
	tokenCPU8    float64         // the same, in CPU per cycle at 8 clients
	renewP99     map[int]time.Duration
	leaseP99     map[int]time.Duration
	renewLargest int
	// kube-apiserver CPU ms per renew by held permits: through the route,
	// Leases by merge patch and by update, the CRD copy.
	renewCPU, leaseCPU, leaseUpdateCPU, floorCPU map[int]float64
	// The semaphore's handoff gaps, with waitSeconds and polling.
	semWait, semPoll *gaps
	// The route's cycles to the floor's with the clients in their own
	// process, as users run it.
	external *extResult
	// Acquires with 0, 1 and 10 bound objects: p50 and p99 to 0's.
	bound map[int][2]float64
	// kube-apiserver CPU per renew, QueenLock lock to Lease lock, by
	// round; a fenced write's p50 and p99 to a plain one's at 8 writers.
	electionCPU          *spread
	fencedP50, fencedP99 float64
	// The Locks page at 10,000 permits.
	page *pageFigures
	// The line: leaving it, and its handoffs over two replicas.
	line *lineResult
}

// section is one part of the report.
type section struct {
	name string
	run  func(*bench) error
	// own: the section starts what it measures itself (make dev, a test
	// binary) and needs no control plane in this process.
	own bool
}

// sections are the parts of the report, in order (-sections picks some).
var sections = []section{
	{"calls", (*bench).calls, false},
	{"cycles", (*bench).cycles, false},
	{"external", (*bench).external, true},
	{"batch", (*bench).batch, false},
	{"bound", (*bench).bound, false},
	{"renew", (*bench).renew, false},
	{"election", (*bench).election, false},
	{"memory", (*bench).memory, false},
	{"wakeup", (*bench).wakeup, false},
	{"line", (*bench).line, false},
	{"gated", (*bench).gated, false},
	{"dashboard", (*bench).dashboard, true},
}

func run(d time.Duration, outPath string, nPermits, nCalls int, only []string) error {
	for _, name := range only {
		if !slices.ContainsFunc(sections, func(s section) bool { return s.name == name }) {
			return fmt.Errorf("-sections: no section %q", name)
		}
	}
	bn := &bench{d: d, nPermits: nPermits, nCalls: nCalls}
	// Most sections run on a control plane and a manager in this process;
	// the external one starts its own, as make dev does, and the dashboard
	// one runs a test that starts its own: they need nothing here.
	needLocal := false
	for _, s := range sections {
		needLocal = needLocal || (!s.own && (len(only) == 0 || slices.Contains(only, s.name)))
	}
	if needLocal {
		stop, err := bn.startLocal()
		if err != nil {
			return err
		}
		defer stop()
	} else {
		quietLogs()
	}

	b := &bn.b
	fmt.Fprintf(b, "Measured %s on this machine: %d cores, %s memory, %s, one local control plane (etcd and kube-apiserver built by the project). "+
		"The machine was shared with other engineers' builds and tests: load average (1, 5, 15 min) %s at the start, %%END_LOAD%% at the end.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), memTotal(), runtime.Version(), procfs.LoadAvg())
	if featureGates != "" {
		fmt.Fprintf(b, "kube-apiserver ran with `--feature-gates=%s`.\n\n", featureGates)
	}
	for _, s := range sections {
		if len(only) > 0 && !slices.Contains(only, s.name) {
			continue
		}
		if err := s.run(bn); err != nil {
			// What was measured so far is kept, for the log.
			fmt.Print(b.String())
			return fmt.Errorf("%s: %w", s.name, err)
		}
		fmt.Fprint(os.Stderr, ".")
	}
	fmt.Fprintln(os.Stderr)
	report := strings.Replace(b.String(), "%END_LOAD%", procfs.LoadAvg(), 1) + bn.sum.write()
	fmt.Print(report)
	if outPath != "" {
		doc := "# Benchmarks\n\nReproduce with `make bench` (about half an hour; `go run ./test/bench -sections NAME,...` for some sections alone: `external` for the route as users run it, about five minutes, `bound`, `line`, `election` and `dashboard` about two, one (past the control plane's start), four and five). Numbers are from one run on a shared, noisy machine: read the ratios, measured in the same run, rather than the absolute figures.\n\n" + report + notes
		return os.WriteFile(outPath, []byte(doc), 0o644)
	}
	return nil
}

// startLocal starts the control plane and the manager in this process,
// and the routes the in-process sections call; stop ends them.
func (bn *bench) startLocal() (stop func(), err error) {
	// The manager, and the routes started here, run under the manager's
	// own ServiceAccount as installed: its stamped updates then skip the
	// permit webhook as they do in a cluster.
	opts := controlplane.Options{ManagerConfig: controlplane.AsManagerServiceAccount}
	if featureGates != "" {
		opts.APIServerFlags = map[string]string{"feature-gates": featureGates}
	}
	env, err := controlplane.Start(opts)
	if err != nil {
		return nil, err
	}
	stops := []func(){func() { _ = env.Stop() }}
	fail := func(err error) (func(), error) {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
		return nil, err
	}
	ctx := context.Background()
	if _, err := env.Clientset.CoreV1().Namespaces().Create(ctx, nsObj("bench"), metav1.CreateOptions{}); err != nil {
		return fail(err)
	}
	// Every client without a client-side rate limit, as the route's are.
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = -1, 0
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fail(err)
	}
	kc, err := client.NewWithWatch(cfg, client.Options{Scheme: manager.Scheme})
	if err != nil {
		return fail(err)
	}
	// Two routes as the manager runs them (its grace, its informer as a
	// source of permit versions): without auth, and with ServiceAccount
	// tokens checked by TokenReview and SubjectAccessReview.
	noneURL, stopNone, err := env.StartRouteConfig(route.Config{Auth: route.AuthNone, DefaultNamespace: "bench"})
	if err != nil {
		return fail(err)
	}
	stops = append(stops, stopNone)
	// Every bench client is on loopback, one address: the per-address
	// bounds are lifted to the route's whole, as a cluster's many pod
	// addresses would.
	// The call table also waits on 40 locks at once as one caller.
	tl := route.DefaultLimits()
	tl.MaxConnectionsPerSource, tl.MaxCallsPerSource = tl.MaxConnections, tl.MaxCalls
	tl.MaxCallsPerCaller = tl.MaxCalls
	tokenURL, stopToken, err := env.StartRouteConfig(route.Config{Auth: route.AuthToken, Limits: tl})
	if err != nil {
		return fail(err)
	}
	stops = append(stops, stopToken)
	var saNames []string
	for w := range 32 {
		saNames = append(saNames, fmt.Sprint("holder-", w))
	}
	tokens, err := holderTokens(ctx, cs, "bench", saNames)
	if err != nil {
		return fail(err)
	}
	if err := awaitRBAC(ctx, cs, "bench", saNames); err != nil {
		return fail(err)
	}
	ps, err := findProcs(env)
	if err != nil {
		return fail(err)
	}
	bn.env, bn.procs, bn.cfg, bn.cs, bn.noneURL = env, ps, cfg, cs, noneURL
	bn.httpT = handle.HTTP(noneURL, handle.HTTPOptions{Namespace: "bench", Client: routeClient})
	bn.kubeT = handle.Kube(kc, "bench")
	for _, tok := range tokens {
		bn.tokenT = append(bn.tokenT, handle.HTTP(tokenURL, handle.HTTPOptions{Token: tok, Client: routeClient}))
	}
	if err := waitRoute(bn.httpT); err != nil {
		return fail(err)
	}
	if err := waitRoute(bn.tokenT[0]); err != nil {
		return fail(err)
	}
	bn.idle = bn.procs.idleRate(5 * time.Second)
	return func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}, nil
}

// calls counts the API calls of each operation.
func (bn *bench) calls() error {
	// API calls per operation, from kube-apiserver's own counters.
	fmt.Fprintf(&bn.b, "## API calls per operation\n\n"+
		"Read from kube-apiserver's own `%s` (by verb and resource) and `%s`, scraped before and after %d operations of each kind, one after another, and divided by %d. "+
		"Reviews are cached by the route (5 s by default, at most 10 s), so their share falls as calls come faster. "+
		"The last column is the control plane's own background in the same window (its leases and endpoints), not lock calls.\n\n",
		requestTotal, webhookTotal, bn.nCalls, bn.nCalls)
	rows, err := countCalls(context.Background(), bn.cs, []callPath{
		{"route, no auth", bn.httpT},
		{"route, token auth", bn.tokenT[0]},
		{"handle, direct Kubernetes API", bn.kubeT},
	}, bn.nCalls)
	if err != nil {
		return err
	}
	writeCalls(&bn.b, rows)
	bn.sum.callsRun = true
	bn.sum.callsOff = offTarget(rows)

	return nil
}

// cycles measures acquire+release cycles against the Lease baseline.
func (bn *bench) cycles() error {
	fmt.Fprintf(&bn.b, "\n## Acquire + release cycles, all in one process\n\n"+
		"These rows run the clients, the route, the webhooks and the manager in the benchmark's one Go process, which is not how anyone runs them: "+
		"they compare paths and follow changes over time. The next section measures the route as users run it, its callers in a process of their own. "+
		"Each worker loops over its own lock: acquire, then release. %s per row, in one-second rounds that take the paths in turn. "+
		"With token auth each worker is its own ServiceAccount, bound to the holder role, with a token of audience queen-locks. "+
		"The second row is a floor: a copy of the QueenLock CRD (schema and CEL rules) under another group, which no webhook intercepts and no informer watches, created and deleted directly with the times written by the client. "+
		"CPU time per cycle is read from /proc for this run's kube-apiserver and etcd and for the benchmark's own process, which runs the route, the webhooks, the manager's informer and the clients, "+
		"less what they used idle (measured for 5 s before the rows: kube-apiserver %s ms/s, etcd %s ms/s, this process %s ms/s).\n\n", bn.d,
		perCycle(bn.idle.apiserver, 1), perCycle(bn.idle.etcd, 1), perCycle(bn.idle.self, 1))
	fmt.Fprintf(&bn.b, "| path | clients | cycles/s | ratio to Lease | p50 | p99 | CPU ms per cycle: kube-apiserver | etcd | this process |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	lease := func(ctx context.Context, w, i int) error {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("w%d", w)}}
		if _, err := bn.cs.CoordinationV1().Leases("bench").Create(ctx, l, metav1.CreateOptions{}); err != nil {
			return err
		}
		return bn.cs.CoordinationV1().Leases("bench").Delete(ctx, l.Name, metav1.DeleteOptions{})
	}
	lockCycle := func(transport func(w int) handle.Transport, prefix string) cycle {
		return func(ctx context.Context, w, i int) error {
			t := transport(w)
			name := fmt.Sprintf("%s-%d", prefix, w)
			a, err := t.Acquire(ctx, name, fmt.Sprint("w", w), 30, 1)
			if err != nil {
				return err
			}
			if !a.Acquired {
				return fmt.Errorf("acquire of %s: %s", name, a.Reason)
			}
			ok, err := t.Release(ctx, name, 0, a.Token, fmt.Sprint("w", w))
			if err == nil && !ok {
				err = fmt.Errorf("release of %s answered lost", name)
			}
			return err
		}
	}
	const (
		floorName  = "QueenLock CRD copy create+delete: no webhook, no informer"
		routeNone  = "route (HTTP, JSON), no auth"
		routeToken = "route (HTTP, JSON), token auth"
	)
	tokenVsNone := map[int]float64{}
	floor, err := floorCycle(context.Background(), bn.cfg, "bench")
	if err != nil {
		return err
	}
	for _, conc := range []int{1, 8, 32} {
		routeNoneCycle := lockCycle(func(int) handle.Transport { return bn.httpT }, fmt.Sprint("r", conc))
		rows, err := interleave([]path{
			{"Lease create+delete (baseline)", lease},
			{floorName, floor},
			{routeNone, routeNoneCycle},
			{routeToken, lockCycle(func(w int) handle.Transport { return bn.tokenT[w] }, fmt.Sprint("t", conc))},
			{"handle, direct Kubernetes API", lockCycle(func(int) handle.Transport { return bn.kubeT }, fmt.Sprint("k", conc))},
		}, conc, bn.d, bn.procs, bn.idle)
		if err != nil {
			return err
		}
		base := rows[0]
		for _, r := range rows {
			fmt.Fprintf(&bn.b, "| %s | %d | %.0f | %.2f | %s | %s | %s | %s | %s |\n", r.name, r.conc, r.rate(), r.rate()/base.rate(), ms(r.p50), ms(r.p99),
				perCycle(r.cpu.apiserver, r.cycles), perCycle(r.cpu.etcd, r.cycles), perCycle(r.cpu.self, r.cycles))
		}
		if profileDir != "" && conc >= 8 {
			// Profiled apart from the table, one path at a time; at 32
			// clients the route with and without token auth, to tell the
			// cost of the reviews from the noise of a shared machine.
			pts := []path{{"lease", lease}, {"floor", floor}, {"route", routeNoneCycle}}
			if conc == 32 {
				pts = []path{{"route-32", routeNoneCycle}, {"token-32", lockCycle(func(w int) handle.Transport { return bn.tokenT[w] }, "pt32")}}
			}
			for _, pt := range pts {
				if err := bn.profile(pt, conc); err != nil {
					return err
				}
			}
		}
		tokenVsNone[conc] = rows[3].rate() / rows[2].rate()
		if conc == 8 {
			bn.sum.ratio8, bn.sum.floor8 = rows[2].rate()/base.rate(), rows[1].rate()/base.rate()
			bn.sum.tokenCPU8 = float64(rows[3].cpu.total()) / float64(rows[3].cycles) / (float64(rows[2].cpu.total()) / float64(rows[2].cycles))
		}
	}
	fmt.Fprintf(&bn.b, "\nThe route with token auth against the route without, in the same run: %.2f at 1 client, %.2f at 8, %.2f at 32.\n",
		tokenVsNone[1], tokenVsNone[8], tokenVsNone[32])
	bn.sum.tokenVs = tokenVsNone

	// In the rounds above each path runs one second in five, and the route
	// keeps a review for DefaultReviewTTL (5 s): every token round starts
	// with each caller's reviews expired, as for a caller that calls once
	// every five seconds. A caller that keeps calling pays its reviews once
	// per TTL; these rounds take only the two route paths in turn, so each
	// token caller calls at least every other second.
	fmt.Fprintf(&bn.b, "\n### Token auth for callers that keep calling\n\n"+
		"The two route rows alone, in one-second rounds that alternate, %s each: every token caller calls again within the review cache's %s, "+
		"and pays its TokenReview and SubjectAccessReviews once per %s rather than at the start of every round.\n\n"+
		"| clients | no auth, cycles/s | token auth, cycles/s | token / no auth | CPU per cycle, token / no auth |\n|---:|---:|---:|---:|---:|\n",
		bn.d, route.DefaultReviewTTL, route.DefaultReviewTTL)
	steady := map[int]float64{}
	for _, conc := range []int{1, 8, 32} {
		rows, err := interleave([]path{
			{routeNone, lockCycle(func(int) handle.Transport { return bn.httpT }, fmt.Sprint("sr", conc))},
			{routeToken, lockCycle(func(w int) handle.Transport { return bn.tokenT[w] }, fmt.Sprint("st", conc))},
		}, conc, bn.d, bn.procs, bn.idle)
		if err != nil {
			return err
		}
		steady[conc] = rows[1].rate() / rows[0].rate()
		cpu := float64(rows[1].cpu.total()) / float64(rows[1].cycles) / (float64(rows[0].cpu.total()) / float64(rows[0].cycles))
		fmt.Fprintf(&bn.b, "| %d | %.0f | %.0f | %.2f | %.2f |\n", conc, rows[0].rate(), rows[1].rate(), steady[conc], cpu)
	}
	bn.sum.tokenSteady = steady

	return nil
}

// profile runs pt at conc clients for the row's duration under CPU
// profiles of this process and kube-apiserver, and says what it measured.
func (bn *bench) profile(pt path, conc int) error {
	stop, err := startProfiles(bn.env.Config, bn.d, pt.name)
	if err != nil {
		return err
	}
	before := bn.procs.times()
	r, _, err := measure(pt.name, conc, bn.d, pt.c)
	if err != nil {
		return err
	}
	cpu := bn.procs.times().minus(before).aboveIdle(bn.idle, r.secs)
	if err := stop(); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "\nprofiled %s at %d clients: %d cycles, %.0f/s; CPU ms per cycle: kube-apiserver %s, etcd %s, this process %s\n",
		pt.name, conc, r.cycles, r.rate(), perCycle(cpu.apiserver, r.cycles), perCycle(cpu.etcd, r.cycles), perCycle(cpu.self, r.cycles))
	return nil
}

// batch compares one call of 64 acquires with 64 calls of one.
func (bn *bench) batch() error {
	// One call of 64 acquires against 64 calls of one.
	fmt.Fprintf(&bn.b, "\n## Batching\n\n| what | time for 64 acquires |\n|---|---:|\n")
	batch := `{"namespace":"bench","operations":[`
	for i := range 64 {
		if i > 0 {
			batch += ","
		}
		batch += fmt.Sprintf(`{"op":"acquire","name":"batch-%d","ttlSeconds":30,"owner":"b"}`, i)
	}
	batch += "]}"
	t0 := time.Now()
	if err := post(bn.noneURL, batch); err != nil {
		return err
	}
	one := time.Since(t0)
	t0 = time.Now()
	for i := range 64 {
		if _, err := bn.httpT.Acquire(context.Background(), fmt.Sprint("single-", i), "b", 30, 1); err != nil {
			return err
		}
	}
	many := time.Since(t0)
	fmt.Fprintf(&bn.b, "| one call of 64 operations | %s |\n| 64 calls of one operation, one after another | %s |\n", ms(one), ms(many))

	// The 128 permits go now, not 30 s later by expiry in the middle of
	// the renew rows that come next, whose first step they would load.
	for i := range 64 {
		for _, lock := range []string{fmt.Sprint("batch-", i), fmt.Sprint("single-", i)} {
			p := &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: permit.Name(lock, 0)}}
			if err := bn.env.Client.Delete(context.Background(), p); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
	}
	return nil
}

// renew measures a growing renew load through the route, then the same
// steps of Leases renewed directly, as a baseline of what the machine
// allowed meanwhile.
func (bn *bench) renew() error {
	fmt.Fprintf(&bn.b, "\n## Renew load\n\nN permits held through the route (no auth), each renewed every %s (a third of a %d s TTL) at its own phase; "+
		"the renews that start in a %s window are measured, then more permits are acquired and the next window begins. "+
		"The steps stop at the first whose p99 passes %s. The route renews a permit with one update, stamped by the route itself, that skips the permit webhook "+
		"(the manager runs under its own ServiceAccount, as the chart installs it). "+
		"Then the same steps, all of them, with plain Leases, each renewed by a merge patch of its renewTime conditional on its resourceVersion "+
		"(without the route, the webhook and the CRD), as a baseline of what the machine allowed; and again with Leases renewed by an update of the whole Lease, "+
		"as client-go's leader election renews them. "+
		"Last, the same steps with copies of permits (the floor CRD of the cycles) renewed by the route's update with the times stamped by the client: no webhook and no route, the least a renew of a permit can cost kube-apiserver. "+
		"Each kind's first step waits (up to a minute) until kube-apiserver's CPU is back within %s a second of its idle use, so that what the rows before left behind is not charged to it; "+
		"each window opens one renew period after its step's permits were acquired, so that the acquires' own tail is not counted. "+
		"CPU per renew is the window's, less the idle use measured before the cycles.\n\n"+
		"| what | held | renews/s | renews | renew p50 | renew p99 | lost | CPU ms per renew: kube-apiserver | etcd | this process | machine load (1 min) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
		renewEvery, renewTTL, renewWindow, ms(renewBound), ms(settleMargin))
	route, lease, leaseUpdate, floor := newRenewRow(), newRenewRow(), newRenewRow(), newRenewRow()
	steps, largest, err := bn.renewSteps("permits through the route", permits{bn.httpT}, renewSteps, true, "renew", route)
	if err != nil {
		return err
	}
	bn.sum.renewLargest = largest
	if _, _, err := bn.renewSteps("Leases (baseline): merge patch", leases{bn.cs, "bench", nil}, steps, false, "lease-renew", lease); err != nil {
		return err
	}
	if _, _, err := bn.renewSteps("Leases: update", leases{bn.cs, "bench", &sync.Map{}}, steps, false, "lease-update-renew", leaseUpdate); err != nil {
		return err
	}
	fc, err := installFloor(context.Background(), bn.cfg, "bench")
	if err != nil {
		return err
	}
	if _, _, err := bn.renewSteps("QueenLock CRD copy: no webhook, no route", floorPermits{fc, "bench", &sync.Map{}}, steps, false, "floor-renew", floor); err != nil {
		return err
	}
	bn.sum.renewP99, bn.sum.leaseP99 = route.p99, lease.p99
	bn.sum.renewCPU, bn.sum.leaseCPU, bn.sum.leaseUpdateCPU, bn.sum.floorCPU = route.apiserver, lease.apiserver, leaseUpdate.apiserver, floor.apiserver
	fmt.Fprintf(&bn.b, "\nThe largest step whose renew p99 through the route stayed under %s with nothing lost: %d held permits.\n", ms(renewBound), largest)
	return nil
}

// renewRow is what one kind of holding measured at each step.
type renewRow struct {
	p99       map[int]time.Duration
	apiserver map[int]float64 // kube-apiserver CPU ms per renew
}

func newRenewRow() renewRow {
	return renewRow{p99: map[int]time.Duration{}, apiserver: map[int]float64{}}
}

// renewSteps grows a fleet of h through steps, measuring a window at each,
// until a step's p99 passes renewBound when bounded. It answers the steps
// it measured and the largest that stayed under the bound. The 1000 step
// is profiled when -profile asks.
func (bn *bench) renewSteps(what string, h holding, steps []int, bounded bool, profile string, row renewRow) (done []int, largest int, err error) {
	// Each kind starts on a kube-apiserver that has settled from what came
	// before it (settle), and says how long that took.
	waited := bn.procs.settle(bn.idle, time.Minute)
	fmt.Fprintf(os.Stderr, "\n%s: kube-apiserver settled in %s\n", what, waited.Round(time.Second))
	f := newFleet(h)
	defer f.close()
	for _, n := range steps {
		if n > renewMax {
			break
		}
		if err := f.grow(n); err != nil {
			return nil, 0, err
		}
		// The acquires' tail (watch events, the informers, garbage
		// collection) is not the renews' cost: the window opens once every
		// new permit has renewed once.
		time.Sleep(renewEvery)
		var stop func() error
		if profileDir != "" && n == 1000 {
			if stop, err = startProfiles(bn.env.Config, renewWindow, profile); err != nil {
				return nil, 0, err
			}
		}
		before := bn.procs.times()
		t0 := time.Now()
		r, lost := f.measure(renewWindow)
		cpu := bn.procs.times().minus(before).aboveIdle(bn.idle, time.Since(t0).Seconds())
		if stop != nil {
			if err := stop(); err != nil {
				return nil, 0, err
			}
		}
		fmt.Fprintf(&bn.b, "| %s | %d | %.0f | %d | %s | %s | %d | %s | %s | %s | %s |\n", what, n, float64(r.cycles)/renewWindow.Seconds(), r.cycles, ms(r.p50), ms(r.p99), lost,
			perCycle(cpu.apiserver, r.cycles+lost), perCycle(cpu.etcd, r.cycles+lost), perCycle(cpu.self, r.cycles+lost), loadAvg1())
		fmt.Fprint(os.Stderr, ".")
		done = append(done, n)
		row.p99[n] = r.p99
		if calls := r.cycles + lost; calls > 0 {
			row.apiserver[n] = float64(cpu.apiserver.Microseconds()) / 1000 / float64(calls)
		}
		if r.p99 >= renewBound || lost > 0 {
			if bounded {
				break
			}
			continue
		}
		largest = n
	}
	return done, largest, nil
}

// memory measures what held permits cost the manager.
func (bn *bench) memory() error {
	// Memory with many held permits in the manager's cache. The manager
	// shares this process with the benchmark, so the figure is the live Go
	// heap after a collection (what the cache keeps), beside the process's
	// resident memory.
	heapBefore, rssBefore := liveHeap(), rss()
	if err := holdMany(bn.kubeT, bn.nPermits); err != nil {
		return err
	}
	if err := waitCached(bn.env, bn.nPermits); err != nil {
		return err
	}
	heapAfter, rssAfter := liveHeap(), rss()
	fmt.Fprintf(&bn.b, "\n## Memory\n\n%d more permits held, all in the manager's informer cache:\n\n| | before | after | per permit |\n|---|---:|---:|---:|\n", bn.nPermits)
	fmt.Fprintf(&bn.b, "| live Go heap after GC (manager and benchmark in one process) | %s | %s | %.1f KiB |\n", mib(heapBefore), mib(heapAfter), float64(heapAfter-heapBefore)/1024/float64(bn.nPermits))
	fmt.Fprintf(&bn.b, "| process resident memory | %s | %s | %.1f KiB |\n", mib(rssBefore), mib(rssAfter), float64(rssAfter-rssBefore)/1024/float64(bn.nPermits))

	return nil
}

// renewWindow is how long each renew load step is measured.
const renewWindow = 20 * time.Second

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}
