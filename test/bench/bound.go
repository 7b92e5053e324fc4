package main

import (
	"context"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/queen-locks/queen-locks/permit"
)

// The bound section prices the raise of the fence: an acquire that wins a
// slot first raises the fence record of every object bound to that slot,
// one patch each, and only then answers. Slots with 0, 1 and 10 bound
// objects are acquired through the route in the same run.

// boundCounts are the objects bound to each slot of the rows.
var boundCounts = []int{0, 1, 10}

const (
	boundLocks  = 20 // locks per row, each with its own bound objects
	boundRounds = 5  // rounds of boundLocks acquires, the rows in turn
)

// boundResources are what an acquire with bound objects touches: the
// permits, and the guarded kinds the raise lists and patches.
var boundResources = []string{"queenlocks", "queenlockfences", "configmaps", "secrets"}

func boundLock(k, i int) string { return fmt.Sprintf("bound%d-%d", k, i) }

// bindObjects binds k ConfigMaps to slot 0 of each of the row's locks: a
// holder creates them guarded, then releases.
func (bn *bench) bindObjects(ctx context.Context, k int) error {
	for i := range boundLocks {
		lock := boundLock(k, i)
		a, err := bn.httpT.Acquire(ctx, lock, "binder", 60, 1)
		if err != nil || !a.Acquired {
			return unexpected("acquired", a, err)
		}
		for j := range k {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("%s-%d", lock, j),
				Labels:      map[string]string{permit.GuardedLabel: "true"},
				Annotations: map[string]string{permit.GuardAnnotation: permit.Guard{Lock: lock, Token: a.Token}.String()}}}
			if err := bn.env.Client.Create(ctx, cm); err != nil {
				return fmt.Errorf("binding %s to %s: %w", cm.Name, lock, err)
			}
		}
		if ok, err := bn.httpT.Release(ctx, lock, 0, a.Token, "binder"); err != nil || !ok {
			return unexpected("released", ok, err)
		}
	}
	return nil
}

// acquireAll acquires every lock of row k and answers each acquire's
// time and token; releaseAll gives them back.
func (bn *bench) acquireAll(ctx context.Context, k int) ([]time.Duration, []uint64, error) {
	lat, tokens := make([]time.Duration, boundLocks), make([]uint64, boundLocks)
	for i := range boundLocks {
		t0 := time.Now()
		a, err := bn.httpT.Acquire(ctx, boundLock(k, i), "a", 60, 1)
		lat[i] = time.Since(t0)
		if err != nil || !a.Acquired || a.Already {
			return nil, nil, unexpected("acquired", a, err)
		}
		tokens[i] = a.Token
	}
	return lat, tokens, nil
}

func (bn *bench) releaseAll(ctx context.Context, k int, tokens []uint64) error {
	for i, tok := range tokens {
		if ok, err := bn.httpT.Release(ctx, boundLock(k, i), 0, tok, "a"); err != nil || !ok {
			return unexpected("released", ok, err)
		}
	}
	return nil
}

// bound measures acquires of slots with 0, 1 and 10 bound objects.
func (bn *bench) bound() error {
	ctx := context.Background()
	for _, k := range boundCounts {
		if err := bn.bindObjects(ctx, k); err != nil {
			return err
		}
	}
	b := &bn.b
	fmt.Fprintf(b, "\n## Acquires of a slot with bound objects\n\n"+
		"An acquire that wins a slot raises the fence record of each object bound to that slot before it answers: "+
		"one GET of the slot's QueenLockFence (served from etcd; a 404 when nothing was ever bound), then one patch per bound object. "+
		"%d locks per row, each with its own bound ConfigMaps (bound by a holder's guarded create, then released), acquired through the route (no auth) one after another. "+
		"API calls are kube-apiserver's counts around %d acquires of free slots, divided by %d (releases outside the window). "+
		"Latency is each acquire's, from the client, over %d rounds that take the rows in turn, each acquire followed by its release; "+
		"CPU is per acquire and release, less the idle use.\n\n"+
		"| bound objects | API calls per acquire | by verb and resource | admission webhook calls per acquire |\n|---:|---:|---|---|\n",
		boundLocks, boundLocks, boundLocks, boundRounds)
	for _, k := range boundCounts {
		before, err := settledScrape(ctx, bn.cs)
		if err != nil {
			return err
		}
		_, tokens, err := bn.acquireAll(ctx, k)
		if err != nil {
			return fmt.Errorf("%d bound: %w", k, err)
		}
		after, err := settledScrape(ctx, bn.cs)
		if err != nil {
			return err
		}
		d := after.minus(before)
		calls := d.split(boundResources)
		fmt.Fprintf(b, "| %d | %s | %s | %s |\n", k, perOp(sum(calls), boundLocks), breakdown(calls, boundLocks, false), breakdown(d.webhooks, boundLocks, false))
		if err := bn.releaseAll(ctx, k, tokens); err != nil {
			return err
		}
	}

	lats := make([][]time.Duration, len(boundCounts))
	cpus := make([]cpuTimes, len(boundCounts))
	for range boundRounds {
		for j, k := range boundCounts {
			before, t0 := bn.procs.times(), time.Now()
			lat, tokens, err := bn.acquireAll(ctx, k)
			if err != nil {
				return fmt.Errorf("%d bound: %w", k, err)
			}
			if err := bn.releaseAll(ctx, k, tokens); err != nil {
				return err
			}
			cpus[j] = cpus[j].plus(bn.procs.times().minus(before).aboveIdle(bn.idle, time.Since(t0).Seconds()))
			lats[j] = append(lats[j], lat...)
		}
		fmt.Fprint(os.Stderr, ".")
	}
	fmt.Fprintf(b, "\n| bound objects | acquires | p50 | p99 | p50 to 0 bound | p99 to 0 bound | CPU ms per acquire+release: kube-apiserver | etcd | this process |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	p50, p99 := percentile(lats[0], 50), percentile(lats[0], 99)
	bn.sum.bound = map[int][2]float64{}
	for j, k := range boundCounts {
		n := len(lats[j])
		q50, q99 := percentile(lats[j], 50), percentile(lats[j], 99)
		fmt.Fprintf(b, "| %d | %d | %s | %s | %.2f | %.2f | %s | %s | %s |\n", k, n, ms(q50), ms(q99), float64(q50)/float64(p50), float64(q99)/float64(p99),
			perCycle(cpus[j].apiserver, n), perCycle(cpus[j].etcd, n), perCycle(cpus[j].self, n))
		bn.sum.bound[k] = [2]float64{float64(q50) / float64(p50), float64(q99) / float64(p99)}
	}
	return nil
}
