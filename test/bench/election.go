package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/election"
	"github.com/queen-locks/queen-locks/internal/manager"
)

// The election section sets package election's lock beside client-go's
// Lease lock, as a controller uses either: leaders renewing at
// controller-runtime's default timings, and then a leader's writes through
// the fenced client against the same writes through a plain one.

// controller-runtime's default leader election timings, which both kinds
// of lock run with.
const (
	electLease   = 15 * time.Second
	electRenew   = 10 * time.Second
	electRetry   = 2 * time.Second
	electLeaders = 100 // leaders renewing at once, each on its own lock
	electWindow  = 20 * time.Second
	electRounds  = 3
)

// electors are leaders of one kind of lock, each on its own lock name,
// whose renews are counted while counting is set.
type electors struct {
	counting atomic.Bool
	leading  atomic.Int64
	mu       sync.Mutex
	renews   []time.Duration // how long each renew's write took
	failed   int
	cancel   context.CancelFunc
	done     sync.WaitGroup
}

// counted is a lock whose updates (renews, once every leader leads) are
// timed and counted.
type counted struct {
	resourcelock.Interface
	e *electors
}

func (c counted) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	t0 := time.Now()
	err := c.Interface.Update(ctx, r)
	if c.e.counting.Load() {
		c.e.mu.Lock()
		if err == nil {
			c.e.renews = append(c.e.renews, time.Since(t0))
		} else {
			c.e.failed++
		}
		c.e.mu.Unlock()
	}
	return err
}

// startElectors starts n leader electors over the locks mk makes, their
// starts spread over one retry period so that their renews are too, and
// answers once every one of them leads.
func startElectors(n int, mk func(i int) (resourcelock.Interface, error)) (*electors, error) {
	ctx, cancel := context.WithCancel(context.Background())
	e := &electors{cancel: cancel}
	for i := range n {
		l, err := mk(i)
		if err != nil {
			e.stop()
			return nil, err
		}
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: counted{l, e}, LeaseDuration: electLease, RenewDeadline: electRenew, RetryPeriod: electRetry,
			ReleaseOnCancel: true, Name: l.Describe(),
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) { e.leading.Add(1) },
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			e.stop()
			return nil, err
		}
		e.done.Go(func() { le.Run(ctx) })
		time.Sleep(electRetry / time.Duration(n))
	}
	deadline := time.Now().Add(2 * time.Minute)
	for e.leading.Load() < int64(n) {
		if time.Now().After(deadline) {
			e.stop()
			return nil, fmt.Errorf("%d of %d leaders lead after 2 minutes", e.leading.Load(), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return e, nil
}

// stop ends every elector; each releases its lock as it ends.
func (e *electors) stop() {
	e.cancel()
	e.done.Wait()
}

// renewRound is what one kind's leaders cost over one window.
type renewRound struct {
	renews, failed int
	lat            []time.Duration
	cpu            cpuTimes
	calls          tally
}

// electionRenews runs one window of n leaders of one kind of lock.
func (bn *bench) electionRenews(n int, mk func(i int) (resourcelock.Interface, error)) (renewRound, error) {
	bn.procs.settle(bn.idle, 30*time.Second)
	e, err := startElectors(n, mk)
	if err != nil {
		return renewRound{}, err
	}
	defer e.stop()
	// Every leader renews once before the window: their acquires' tail
	// is not a renew's cost.
	time.Sleep(electRetry)
	ctx := context.Background()
	before, err := scrape(ctx, bn.cs)
	if err != nil {
		return renewRound{}, err
	}
	cpu0, t0 := bn.procs.times(), time.Now()
	e.counting.Store(true)
	time.Sleep(electWindow)
	e.counting.Store(false)
	cpu := bn.procs.times().minus(cpu0).aboveIdle(bn.idle, time.Since(t0).Seconds())
	after, err := scrape(ctx, bn.cs)
	if err != nil {
		return renewRound{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return renewRound{renews: len(e.renews), failed: e.failed, lat: append([]time.Duration(nil), e.renews...), cpu: cpu, calls: after.minus(before)}, nil
}

// election measures leader renews and fenced writes.
func (bn *bench) election() error {
	klog.SetLogger(logr.Discard())
	defer klog.ClearLogger()
	b := &bn.b
	fmt.Fprintf(b, "\n## Leader election: package election against client-go's Lease lock\n\n"+
		"%d leaders of one kind at once, each on its own lock, run by client-go's `leaderelection` with controller-runtime's default timings "+
		"(lease %s, renew deadline %s, retry period %s): every retry period each renews its lock. "+
		"The Lease lock is client-go's `resourcelock.LeaseLock`; the QueenLock lock is `election.New`, whose renew is one update of the permit that the permit webhook stamps. "+
		"The renews that start in a %s window are counted, after every leader has led and renewed once; %d rounds take the two kinds in turn, each on new locks, "+
		"each starting once kube-apiserver is back near its idle use. CPU per renew is the window's, less the idle use; API calls and webhook calls are kube-apiserver's own counts in the window, per renew (client-go's leader renews its own live lock without reading it first).\n\n"+
		"| lock | round | renews | renews/s | renew write p50 | p99 | failed | API calls per renew | webhook calls per renew | CPU ms per renew: kube-apiserver | etcd | this process | machine load (1 min) |\n"+
		"|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|\n",
		electLeaders, electLease, electRenew, electRetry, electWindow, electRounds)
	kinds := []struct {
		name, resource string
		mk             func(round int) func(i int) (resourcelock.Interface, error)
	}{
		{"Lease (client-go)", "leases", func(round int) func(int) (resourcelock.Interface, error) {
			return func(i int) (resourcelock.Interface, error) {
				return &resourcelock.LeaseLock{
					LeaseMeta:  metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("elect-lease-%d-%d", round, i)},
					Client:     bn.cs.CoordinationV1(),
					LockConfig: resourcelock.ResourceLockConfig{Identity: fmt.Sprintf("leader-%d", i)},
				}, nil
			}
		}},
		{"QueenLock (package election)", "queenlocks", func(round int) func(int) (resourcelock.Interface, error) {
			return func(i int) (resourcelock.Interface, error) {
				return election.New(bn.cfg, "bench", fmt.Sprintf("elect-q-%d-%d", round, i), fmt.Sprintf("leader-%d", i))
			}
		}},
	}
	cpuPer := make([][]float64, len(kinds))
	for round := range electRounds {
		for k, kind := range kinds {
			r, err := bn.electionRenews(electLeaders, kind.mk(round))
			if err != nil {
				return fmt.Errorf("%s: %w", kind.name, err)
			}
			calls := r.calls.split([]string{kind.resource})
			fmt.Fprintf(b, "| %s | %d | %d | %.1f | %s | %s | %d | %s | %s | %s | %s | %s | %s |\n", kind.name, round+1, r.renews,
				float64(r.renews)/electWindow.Seconds(), ms(percentile(r.lat, 50)), ms(percentile(r.lat, 99)), r.failed,
				breakdown(calls, r.renews, false), breakdown(r.calls.webhooks, r.renews, false),
				perCycle(r.cpu.apiserver, r.renews), perCycle(r.cpu.etcd, r.renews), perCycle(r.cpu.self, r.renews), loadAvg1())
			if r.renews > 0 {
				cpuPer[k] = append(cpuPer[k], float64(r.cpu.apiserver.Microseconds())/1000/float64(r.renews))
			}
			fmt.Fprint(os.Stderr, ".")
		}
	}
	var ratios []float64
	for i := range min(len(cpuPer[0]), len(cpuPer[1])) {
		if cpuPer[0][i] > 0 {
			ratios = append(ratios, cpuPer[1][i]/cpuPer[0][i])
		}
	}
	s := spreadOf(ratios)
	bn.sum.electionCPU = &s
	fmt.Fprintf(b, "\nkube-apiserver CPU per renew, QueenLock to Lease, round by round: %s (median, least to most).\n", s)
	return bn.fencedWrites()
}

// fencedWrites times a leader's writes of ConfigMaps through the fenced
// client against the same writes through a plain client.
func (bn *bench) fencedWrites() error {
	ctx := context.Background()
	lock, err := election.New(bn.cfg, "bench", "elect-writer", "writer")
	if err != nil {
		return err
	}
	e, err := startElectors(1, func(int) (resourcelock.Interface, error) { return lock, nil })
	if err != nil {
		return err
	}
	defer e.stop()
	plain, err := client.New(bn.cfg, client.Options{Scheme: manager.Scheme})
	if err != nil {
		return err
	}
	fenced := lock.Client(plain)
	const writers = 8
	objs := map[string][]*corev1.ConfigMap{}
	for _, kind := range []struct {
		name string
		c    client.Client
	}{{"plain", plain}, {"fenced", fenced}} {
		for w := range writers {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("elect-%s-%d", kind.name, w)}, Data: map[string]string{"n": "0"}}
			if err := kind.c.Create(ctx, cm); err != nil {
				return fmt.Errorf("creating %s: %w", cm.Name, err)
			}
			objs[kind.name] = append(objs[kind.name], cm)
		}
	}
	write := func(c client.Client, kind string) cycle {
		return func(ctx context.Context, w, i int) error {
			cm := objs[kind][w]
			cm.Data["n"] = fmt.Sprint(i)
			return c.Update(ctx, cm)
		}
	}
	fmt.Fprintf(&bn.b, "\n### A leader's writes, fenced and not\n\n"+
		"One leader of a QueenLock lock (package election, renewing every %s meanwhile) updates ConfigMaps of its namespace, one per writer, each update carrying the version the last answered: "+
		"through `lock.Client`, which puts the permit's current token on each write and has the guard webhook check it, "+
		"and through the plain controller-runtime client it wraps, on ConfigMaps that are not guarded. %s per row in one-second rounds that take the two in turn.\n\n"+
		"| client | writers | writes/s | to plain | p50 | p99 | CPU ms per write: kube-apiserver | etcd | this process |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
		electRetry, bn.d)
	for _, conc := range []int{1, writers} {
		rows, err := interleave([]path{
			{"plain client, not guarded", write(plain, "plain")},
			{"fenced client (lock.Client), guarded", write(fenced, "fenced")},
		}, conc, bn.d, bn.procs, bn.idle)
		if err != nil {
			return err
		}
		for _, r := range rows {
			fmt.Fprintf(&bn.b, "| %s | %d | %.0f | %.2f | %s | %s | %s | %s | %s |\n", r.name, r.conc, r.rate(), r.rate()/rows[0].rate(), ms(r.p50), ms(r.p99),
				perCycle(r.cpu.apiserver, r.cycles), perCycle(r.cpu.etcd, r.cycles), perCycle(r.cpu.self, r.cycles))
		}
		if conc == writers {
			bn.sum.fencedP50 = float64(rows[1].p50) / float64(rows[0].p50)
			bn.sum.fencedP99 = float64(rows[1].p99) / float64(rows[0].p99)
		}
	}
	if err := lock.Lost(); err != nil {
		return fmt.Errorf("the writer lost its leadership during the rows: %w", err)
	}
	return nil
}
