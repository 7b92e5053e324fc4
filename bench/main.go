// Command bench measures queen-locks on the local control plane, side by
// side with a baseline measured in the same run: plain coordination.k8s.io
// Lease create+delete with client-go against the same API server (the same
// etcd writes, without the webhooks and the route). It prints a markdown
// table and writes it to docs/benchmarks.md.
//
//	make bench                      # go run ./bench -out docs/benchmarks.md
//	go run ./bench -duration 10s    # longer runs per row
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/manager"
	"github.com/queen-locks/queen-locks/route"
)

func main() {
	duration := flag.Duration("duration", 5*time.Second, "how long each throughput row runs")
	out := flag.String("out", "", "also write the report to this file")
	permits := flag.Int("permits", 10000, "held permits for the memory row")
	calls := flag.Int("calls", 40, "operations of each kind whose API calls are counted")
	flag.StringVar(&saveMetrics, "save-metrics", "", "write kube-apiserver's last scraped /metrics text here")
	flag.IntVar(&renewMax, "renew-max", renewSteps[len(renewSteps)-1], "the largest step of the renew load")
	flag.StringVar(&profileDir, "profile", "", "write CPU profiles of the 8-client route row here: this process (route, webhooks, clients) and kube-apiserver")
	flag.Parse()
	if err := run(*duration, *out, *permits, *calls); err != nil {
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
}

func (r result) rate() float64 { return float64(r.cycles) / r.secs }

// measure runs conc workers doing c for d and collects per-cycle latencies.
func measure(name string, conc int, d time.Duration, c cycle) (result, error) {
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
	return r, firstErr
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

func run(d time.Duration, outPath string, nPermits, nCalls int) error {
	env, err := controlplane.Start(controlplane.Options{})
	if err != nil {
		return err
	}
	defer env.Stop()
	ctx := context.Background()
	if _, err := env.Clientset.CoreV1().Namespaces().Create(ctx, nsObj("bench"), metav1.CreateOptions{}); err != nil {
		return err
	}
	// Every client without a client-side rate limit, as the route's are.
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = -1, 0
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	kc, err := client.New(cfg, client.Options{Scheme: manager.Scheme})
	if err != nil {
		return err
	}
	// Two routes as the manager runs them (its grace, its informer as a
	// source of permit versions): without auth, and with ServiceAccount
	// tokens checked by TokenReview and SubjectAccessReview.
	noneURL, stopNone, err := env.StartRouteConfig(route.Config{Auth: route.AuthNone, DefaultNamespace: "bench"})
	if err != nil {
		return err
	}
	defer stopNone()
	tokenURL, stopToken, err := env.StartRouteConfig(route.Config{Auth: route.AuthToken})
	if err != nil {
		return err
	}
	defer stopToken()
	var saNames []string
	for w := range 32 {
		saNames = append(saNames, fmt.Sprint("holder-", w))
	}
	tokens, err := holderTokens(ctx, cs, "bench", saNames)
	if err != nil {
		return err
	}
	if err := awaitRBAC(ctx, cs, "bench", saNames); err != nil {
		return err
	}
	httpT := handle.HTTP(noneURL, handle.HTTPOptions{Namespace: "bench", Client: routeClient})
	tokenT := make([]handle.Transport, len(tokens))
	for w, tok := range tokens {
		tokenT[w] = handle.HTTP(tokenURL, handle.HTTPOptions{Token: tok, Client: routeClient})
	}
	kubeT := handle.Kube(kc, "bench")
	if err := waitRoute(httpT); err != nil {
		return err
	}
	if err := waitRoute(tokenT[0]); err != nil {
		return err
	}

	var b strings.Builder
	loadStart := loadAvg()
	fmt.Fprintf(&b, "Measured %s on this machine: %d cores, %s memory, %s, one local control plane (etcd and kube-apiserver built by the project). "+
		"The machine was shared with other engineers' builds and tests: load average (1, 5, 15 min) %s at the start, %%END_LOAD%% at the end.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), memTotal(), runtime.Version(), loadStart)

	// API calls per operation, from kube-apiserver's own counters.
	fmt.Fprintf(&b, "## API calls per operation\n\n"+
		"Read from kube-apiserver's own `%s` (by verb and resource) and `%s`, scraped before and after %d operations of each kind, one after another, and divided by %d. "+
		"Reviews are cached by the route (5 s by default, at most 10 s), so their share falls as calls come faster. "+
		"The last column is the control plane's own background in the same window (its leases and endpoints), not lock calls.\n\n",
		requestTotal, webhookTotal, nCalls, nCalls)
	rows, err := countCalls(ctx, cs, []callPath{
		{"route, no auth", httpT},
		{"route, token auth", tokenT[0]},
		{"handle, direct Kubernetes API", kubeT},
	}, nCalls)
	if err != nil {
		return err
	}
	writeCalls(&b, rows)
	fmt.Fprint(os.Stderr, ".")

	fmt.Fprintf(&b, "\n## Acquire + release cycles\n\nEach worker loops over its own lock: acquire, then release. %s per row. "+
		"With token auth each worker is its own ServiceAccount, bound to the holder role, with a token of audience queen-locks.\n\n", d)
	fmt.Fprintf(&b, "| path | clients | cycles/s | ratio to Lease | p50 | p99 |\n|---|---:|---:|---:|---:|---:|\n")
	lease := func(ctx context.Context, w, i int) error {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("w%d", w)}}
		if _, err := cs.CoordinationV1().Leases("bench").Create(ctx, l, metav1.CreateOptions{}); err != nil {
			return err
		}
		return cs.CoordinationV1().Leases("bench").Delete(ctx, l.Name, metav1.DeleteOptions{})
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
		routeNone  = "route (HTTP, JSON), no auth"
		routeToken = "route (HTTP, JSON), token auth"
	)
	tokenVsNone := map[int]float64{}
	for _, conc := range []int{1, 8, 32} {
		base, err := measure("Lease create+delete (baseline)", conc, d, lease)
		if err != nil {
			return err
		}
		rows := []result{base}
		for _, p := range []struct {
			name string
			c    cycle
		}{
			{routeNone, lockCycle(func(int) handle.Transport { return httpT }, fmt.Sprint("r", conc))},
			{routeToken, lockCycle(func(w int) handle.Transport { return tokenT[w] }, fmt.Sprint("t", conc))},
			{"handle, direct Kubernetes API", lockCycle(func(int) handle.Transport { return kubeT }, fmt.Sprint("k", conc))},
		} {
			var stop func() error
			if profileDir != "" && conc == 8 && p.name == routeNone {
				if stop, err = startProfiles(env.Config, d); err != nil {
					return err
				}
			}
			r, err := measure(p.name, conc, d, p.c)
			if err != nil {
				return err
			}
			if stop != nil {
				if err := stop(); err != nil {
					return err
				}
			}
			rows = append(rows, r)
		}
		for _, r := range rows {
			fmt.Fprintf(&b, "| %s | %d | %.0f | %.2f | %s | %s |\n", r.name, r.conc, r.rate(), r.rate()/base.rate(), ms(r.p50), ms(r.p99))
		}
		tokenVsNone[conc] = rows[2].rate() / rows[1].rate()
		fmt.Fprint(os.Stderr, ".")
	}
	fmt.Fprintf(&b, "\nThe route with token auth against the route without, in the same run: %.2f at 1 client, %.2f at 8, %.2f at 32.\n",
		tokenVsNone[1], tokenVsNone[8], tokenVsNone[32])

	// One call of 64 acquires against 64 calls of one.
	fmt.Fprintf(&b, "\n## Batching\n\n| what | time for 64 acquires |\n|---|---:|\n")
	batch := `{"namespace":"bench","operations":[`
	for i := range 64 {
		if i > 0 {
			batch += ","
		}
		batch += fmt.Sprintf(`{"op":"acquire","name":"batch-%d","ttlSeconds":30,"owner":"b"}`, i)
	}
	batch += "]}"
	t0 := time.Now()
	if err := post(noneURL, batch); err != nil {
		return err
	}
	one := time.Since(t0)
	t0 = time.Now()
	for i := range 64 {
		if _, err := httpT.Acquire(ctx, fmt.Sprint("single-", i), "b", 30, 1); err != nil {
			return err
		}
	}
	many := time.Since(t0)
	fmt.Fprintf(&b, "| one call of 64 operations | %s |\n| 64 calls of one operation, one after another | %s |\n", ms(one), ms(many))

	// Renew load: a growing fleet of holders, each renewing every 10 s.
	fmt.Fprintf(&b, "\n## Renew load\n\nN permits held through the route (no auth), each renewed every %s (a third of a %d s TTL) at its own phase; "+
		"the renews that start in a %s window are measured, then more permits are acquired and the next window begins. "+
		"The steps stop at the first whose p99 passes %s.\n\n| held permits | renews/s | renews | renew p50 | renew p99 | lost |\n|---|---:|---:|---:|---:|---:|\n",
		renewEvery, renewTTL, renewWindow, ms(renewBound))
	f := newFleet(httpT)
	largest := 0
	for _, n := range renewSteps {
		if n > renewMax {
			break
		}
		if err := f.grow(n); err != nil {
			f.close()
			return err
		}
		r, lost := f.measure(renewWindow)
		fmt.Fprintf(&b, "| %d | %.0f | %d | %s | %s | %d |\n", n, float64(r.cycles)/renewWindow.Seconds(), r.cycles, ms(r.p50), ms(r.p99), lost)
		fmt.Fprint(os.Stderr, ".")
		if r.p99 >= renewBound || lost > 0 {
			break
		}
		largest = n
	}
	f.close()
	fmt.Fprintf(&b, "\nThe largest step whose renew p99 stayed under %s with nothing lost: %d held permits.\n", ms(renewBound), largest)

	// Memory with many held permits in the manager's cache. The manager
	// shares this process with the benchmark, so the figure is the live Go
	// heap after a collection (what the cache keeps), beside the process's
	// resident memory.
	heapBefore, rssBefore := liveHeap(), rss()
	if err := holdMany(kubeT, nPermits); err != nil {
		return err
	}
	if err := waitCached(env, nPermits); err != nil {
		return err
	}
	heapAfter, rssAfter := liveHeap(), rss()
	fmt.Fprintf(&b, "\n## Memory\n\n%d more permits held, all in the manager's informer cache:\n\n| | before | after | per permit |\n|---|---:|---:|---:|\n", nPermits)
	fmt.Fprintf(&b, "| live Go heap after GC (manager and benchmark in one process) | %s | %s | %.1f KiB |\n", mib(heapBefore), mib(heapAfter), float64(heapAfter-heapBefore)/1024/float64(nPermits))
	fmt.Fprintf(&b, "| process resident memory | %s | %s | %.1f KiB |\n", mib(rssBefore), mib(rssAfter), float64(rssAfter-rssBefore)/1024/float64(nPermits))

	fmt.Fprintln(os.Stderr)
	report := strings.Replace(b.String(), "%END_LOAD%", loadAvg(), 1)
	fmt.Print(report)
	if outPath != "" {
		doc := "# Benchmarks\n\nReproduce with `make bench` (about six minutes). Numbers are from one run on a shared, noisy machine: read the ratios, measured in the same run, rather than the absolute figures.\n\n" + report + notes
		return os.WriteFile(outPath, []byte(doc), 0o644)
	}
	return nil
}

// renewWindow is how long each renew load step is measured.
const renewWindow = 20 * time.Second

const notes = `
## Reading the numbers

- Per cycle the baseline makes two API calls (create, delete) and no
  admission call. queen-locks makes four API calls and one webhook call: an
  acquire lists the lock's permits before it creates one (to answer
  "already" without handing an owner a second slot, and to list the
  holders), the create passes the mutating webhook (the re-check after it is
  the CRD's CEL rules, inside the API server), and a release reads the permit
  (to carry an owner's stale token through, and to answer lost for an
  expired lease) before its conditional delete. The route's HTTP and JSON on
  loopback cost little next to that (the route and direct rows are close).
- The target set for this benchmark, the route within 25% of the Lease
  baseline, is not met: the route runs at about a third of it.

## Where the time goes

CPU profiles of the 8-client route row (` + "`go run ./bench -profile DIR`" + ` writes
both; read them with ` + "`go tool pprof -top`" + `), 2026-12-02:

- **kube-apiserver: 1.17 cores** of the machine's 2 (5.84 s of CPU in 5.0 s).
  It is the bottleneck. Of its time: schema coercion of the custom resource's
  unstructured JSON 10%, managed-fields tracking 9%, calling the mutating
  webhook and applying its patch 7%, reads from etcd (the list before an
  acquire, the read before a release) 6%, feeding the manager's informer
  watch 6%, CRD validation 4% (of it, the CEL rules 2.6%). A Lease skips
  the coercion, the webhook, the watch and the validation, and travels as
  protobuf.
- **The benchmark process: 0.38 cores** for the route, the webhooks, the
  manager's informer and the 8 clients together. Decoding API answers from
  JSON 16%, the informer's watch 8%, the webhook server's per-request logger
  2%.
- **Removed after the profile:** the mutating webhook built its answer by
  marshalling the stamped permit and diffing it with the request
  (` + "`jsonpatch.CreatePatch`" + `, 3% of the process); it now writes the four patch
  operations it knows (the lock label and three times). That frees a little
  CPU for the API server; the cycle rows moved within the noise of one run
  each (the route at 8 clients: 0.28 of the baseline before, 0.30 after).
- **What would close more of the gap, not done:** fewer API calls per
  cycle. A one-call renew and release (a patch or delete conditional on the
  token, reading only when the token is stale) needs the holder role to allow
  patch, which the contract does not list, and would answer released for an
  expired lease; an acquire that creates first and lists only when the
  create loses needs another way to keep an owner from a second slot of a
  semaphore. Serving the custom resource as CBOR instead of JSON is a
  Kubernetes feature gate, not a choice of this project.

## Other rows

- The renew load rows show the latency of renews at a steady rate; the rows
  stop at the first step whose p99 passes one second.
- Resident memory includes what the earlier rows allocated and the Go
  runtime has not yet returned, so it can even fall; the live heap after a
  collection is the figure that shows what 10,000 cached permits cost.
`
