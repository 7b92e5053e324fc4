package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/locks"
)

// The wake-up rows measure how long a lock sits free while somebody waits
// for it, with the route's waitSeconds and with the polling every waiter
// did before it (100 ms doubling to 1 s, with jitter), side by side:
//
//   - handoff gap: from a release's answer to the next waiter's acquired
//     answer;
//   - expiry gap: from a dead holder's expireTime to the next waiter's
//     acquired answer (the grace is part of it by design);
//   - pod gap: from the delete of the holder's pod to the next waiter's
//     acquired answer.
type gaps struct {
	name   string
	mode   string
	n      int
	p50    time.Duration
	p99    time.Duration
	target string
}

// waitFor acquires lock for owner, waiting: with the route's waitSeconds,
// or by polling as the handles did before it. It answers when it was
// acquired, by the caller's clock at the answer.
func waitFor(ctx context.Context, t handle.Transport, lock, owner string, limit int, wake bool) (locks.Acquired, time.Time, error) {
	poll := 100 * time.Millisecond
	for ctx.Err() == nil {
		var a locks.Acquired
		var err error
		if wt, ok := t.(handle.WaitingTransport); ok && wake {
			a, _, err = wt.AcquireWaiting(ctx, lock, owner, 60, limit, 30*time.Second)
		} else {
			a, err = t.Acquire(ctx, lock, owner, 60, limit)
		}
		at := time.Now()
		if err != nil {
			return a, at, err
		}
		if a.Acquired {
			return a, at, nil
		}
		if !wake {
			time.Sleep(poll/2 + rand.N(poll))
			poll = min(poll*2, time.Second)
		}
	}
	return locks.Acquired{}, time.Time{}, ctx.Err()
}

// handoffs runs waiters on one lock of limit slots; each, once it holds,
// keeps the slot a moment and releases it, then rests before it waits
// again, so that the next holder is one that was waiting, never the
// releaser taking the slot back at once. It answers, for rounds acquires,
// how long each slot released while some waiter waited sat free: from the
// release's answer to the answer of the next acquire of that slot. A
// release while no waiter is left for it (every other waiter rests, or
// each waiting one has another free slot to take) is not a handoff: the
// slot sits free until a waiter comes back, and is not counted. Waiter w
// calls through ts[w%len(ts)]: the route replicas it is spread over.
func handoffs(ts []handle.Transport, lock string, limit, waiters, rounds int, wake bool) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var mu sync.Mutex
	waiting := 0                    // waiters inside waitFor
	released := map[int]time.Time{} // slots released while some waiter waited, not acquired since
	var out []time.Duration
	var firstErr error
	done := 0
	fail := func(err error) {
		mu.Lock()
		firstErr = err
		mu.Unlock()
		cancel()
	}
	var wg sync.WaitGroup
	for w := range waiters {
		wg.Go(func() {
			owner := fmt.Sprintf("waiter-%d", w)
			t := ts[w%len(ts)]
			for ctx.Err() == nil {
				mu.Lock()
				waiting++
				mu.Unlock()
				a, at, err := waitFor(ctx, t, lock, owner, limit, wake)
				mu.Lock()
				waiting--
				mu.Unlock()
				if err != nil {
					if ctx.Err() == nil {
						fail(err)
					}
					return
				}
				mu.Lock()
				if from, ok := released[a.Slot]; ok {
					out = append(out, at.Sub(from))
					delete(released, a.Slot)
				}
				done++
				if done >= rounds {
					cancel()
				}
				mu.Unlock()
				time.Sleep(20 * time.Millisecond) // the work
				if _, err := t.Release(context.Background(), lock, a.Slot, a.Token, owner); err != nil {
					fail(err)
					return
				}
				mu.Lock()
				if waiting > len(released) {
					released[a.Slot] = time.Now()
				}
				mu.Unlock()
				time.Sleep(100 * time.Millisecond) // rest: let a waiter take it
			}
		})
	}
	wg.Wait()
	return out, firstErr
}

// expiries lets a holder die rounds times (acquire with a 1 s lifetime,
// never renew) while one waiter waits, and answers the gap from each
// expireTime to the waiter's acquire.
func expiries(t handle.Transport, lock string, rounds int, wake bool) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out []time.Duration
	for i := range rounds {
		dead, err := t.Acquire(ctx, lock, fmt.Sprint("dead-", i), 1, 1)
		if err != nil || !dead.Acquired {
			return nil, fmt.Errorf("the holder that dies: %+v %v", dead, err) //nolint:errorlint // err is nil when the call answered but did not acquire: %w would print %!w(<nil>)
		}
		a, at, err := waitFor(ctx, t, lock, fmt.Sprint("next-", i), 1, wake)
		if err != nil {
			return nil, err
		}
		out = append(out, at.Sub(dead.ExpiresAt))
		if _, err := t.Release(ctx, lock, a.Slot, a.Token, fmt.Sprint("next-", i)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// podGaps deletes the holder's pod rounds times while one waiter waits,
// and answers the gap from each delete's answer to the waiter's acquire.
func podGaps(env *controlplane.Env, t handle.Transport, ns, lock string, rounds int) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Only the manager may name a holder pod for a caller: acquire as the
	// manager's ServiceAccount, which this control plane runs it under.
	mcfg, err := controlplane.AsManagerServiceAccount(env)
	if err != nil {
		return nil, err
	}
	mc, err := client.New(mcfg, client.Options{Scheme: manager.Scheme})
	if err != nil {
		return nil, err
	}
	direct := locks.New(mc, nil)
	var out []time.Duration
	for i := range rounds {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprint("holder-", i)},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "job", Image: "job"}}}}
		if err := env.Client.Create(ctx, pod); err != nil {
			return nil, err
		}
		h, err := direct.Acquire(ctx, ns, lock, pod.Name, 600, 1, locks.HolderPod(pod.Namespace, pod.Name, string(pod.UID)))
		if err != nil || !h.Acquired {
			return nil, fmt.Errorf("the pod's acquire: %+v %v", h, err) //nolint:errorlint // err is nil when the call answered but did not acquire: %w would print %!w(<nil>)
		}
		type answer struct {
			a   locks.Acquired
			at  time.Time
			err error
		}
		got := make(chan answer, 1)
		go func() {
			a, at, err := waitFor(ctx, t, lock, fmt.Sprint("next-", i), 1, true)
			got <- answer{a, at, err}
		}()
		time.Sleep(200 * time.Millisecond) // let the waiter queue
		if err := env.Client.Delete(ctx, pod); err != nil {
			return nil, err
		}
		deleted := time.Now()
		r := <-got
		if r.err != nil {
			return nil, r.err
		}
		out = append(out, r.at.Sub(deleted))
		if _, err := t.Release(ctx, lock, r.a.Slot, r.a.Token, fmt.Sprint("next-", i)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func gapsOf(name, mode, target string, d []time.Duration) gaps {
	return gaps{name: name, mode: mode, n: len(d), p50: percentile(d, 50), p99: percentile(d, 99), target: target}
}

// wakeupRows measures every wake-up row on env, over a route it starts.
func wakeupRows(env *controlplane.Env, ns string, rounds int) ([]gaps, error) {
	url, stop, err := env.StartRouteConfig(route.Config{Auth: route.AuthNone, DefaultNamespace: ns})
	if err != nil {
		return nil, err
	}
	defer stop()
	t := handle.HTTP(url, handle.HTTPOptions{Namespace: ns, Client: routeClient})
	var rows []gaps
	for _, wake := range []bool{true, false} {
		mode := map[bool]string{true: "waitSeconds", false: "polling"}[wake]
		lockGaps, err := handoffs([]handle.Transport{t}, "handoff-lock-"+mode, 1, 8, 100, wake)
		if err != nil {
			return nil, fmt.Errorf("handoff, lock, %s: %w", mode, err)
		}
		rows = append(rows, gapsOf("handoff gap, 1 lock, 8 waiters", mode, "p50 ≤ 20 ms, p99 ≤ 100 ms", lockGaps))
		semGaps, err := handoffs([]handle.Transport{t}, "handoff-sem-"+mode, 4, 16, 200, wake)
		if err != nil {
			return nil, fmt.Errorf("handoff, semaphore, %s: %w", mode, err)
		}
		rows = append(rows, gapsOf(semHandoffRow, mode, "p50 ≤ 20 ms, p99 ≤ 100 ms", semGaps))
		exp, err := expiries(t, "expiry-"+mode, max(rounds/10, 5), wake)
		if err != nil {
			return nil, fmt.Errorf("expiry, %s: %w", mode, err)
		}
		rows = append(rows, gapsOf("expiry gap (includes the grace)", mode, fmt.Sprintf("p99 ≤ grace (%v) + 100 ms", env.Grace), exp))
	}
	pg, err := podGaps(env, t, ns, "pod-gone", max(rounds/10, 5))
	if err != nil {
		return nil, fmt.Errorf("pod gap: %w", err)
	}
	rows = append(rows, gapsOf("pod deleted to next acquire", "waitSeconds", "p99 < 1 s", pg))
	return rows, nil
}

// semHandoffRow names the semaphore's handoff rows, which have a target
// of their own (handoffTarget).
const semHandoffRow = "handoff gap, semaphore of 4, 16 waiters"

func wakeupTable(rows []gaps) string {
	var b strings.Builder
	b.WriteString("| row | waiting by | samples | p50 | p99 | target |\n| --- | --- | ---: | ---: | ---: | --- |\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s |\n", r.name, r.mode, r.n, ms(r.p50), ms(r.p99), r.target)
	}
	return b.String()
}

// wakeup is the wake-up section: handoff, expiry and pod gaps, with
// waitSeconds and with polling, side by side.
func (bn *bench) wakeup() error {
	ns := "bench-wake"
	if _, err := bn.env.Clientset.CoreV1().Namespaces().Create(context.Background(), nsObj(ns), metav1.CreateOptions{}); err != nil {
		return err
	}
	rows, err := wakeupRows(bn.env, ns, 100)
	if err != nil {
		return err
	}
	for i := range rows {
		if rows[i].name == semHandoffRow {
			if rows[i].mode == "waitSeconds" {
				bn.sum.semWait = &rows[i]
			} else {
				bn.sum.semPoll = &rows[i]
			}
		}
	}
	b := &bn.b
	b.WriteString("## Waking waiters\n\n")
	fmt.Fprintf(b, "How long a lock sits free while somebody waits for it, from the client's clock: waiters woken by the route (`waitSeconds`) against waiters polling as the handles did before (100 ms doubling to 1 s, with jitter). Each waiter holds 20 ms, releases, and rests 100 ms before it waits again, so the next holder is always one that was waiting. A gap runs from a release to the next acquire of the same slot, and counts only releases while more waiters waited than slots were free (before 2026-12-04 releases were paired with acquires in turn, whatever the slot, and counted when every other waiter was resting too: the semaphore's p99 then measured the rest). The expiry gap includes the skew grace (%v here) by design; the pod gap runs from the answer to the pod's delete.\n\n", bn.env.Grace)
	b.WriteString(wakeupTable(rows))
	b.WriteString("\n")
	return nil
}
