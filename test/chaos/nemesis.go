package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/queen-locks/queen-locks/internal/skewclock"
)

// Faults the nemesis injects.
const (
	FaultManager   = "kill manager"
	FaultClient    = "pause client"
	FaultAPIServer = "kill kube-apiserver"
	FaultEtcd      = "kill etcd"
	// FaultSkew sets each replica's clock offset anew, within the run's
	// skew, ahead or behind; it stays until the next.
	FaultSkew = "skew clocks"
	// FaultCutReplica cuts a replica off from kube-apiserver (its
	// informers, leader election, the route's and the webhooks' reads and
	// writes), for 1 to 4 s.
	FaultCutReplica = "cut replica from kube-apiserver"
	// FaultCutClient cuts a client off from the route, for 1 to 4 s.
	FaultCutClient = "cut client from route"
	// FaultCutWebhook cuts kube-apiserver off from one replica's webhooks,
	// for 1 to 4 s: the calls sent there hang, then fail.
	FaultCutWebhook = "cut webhook from kube-apiserver"
	// FaultPod deletes the pod of the client that holds the lock (of any
	// holder client otherwise) and starts it again under the same name,
	// with --auth=token: the permit that names the pod is freed at once.
	FaultPod = "delete holder's pod"
	// FaultPauseManager, FaultPauseAPIServer and FaultPauseEtcd stop the
	// process with SIGSTOP for 0.5 to 4 s, then SIGCONT: a frozen node, a
	// long GC or an overloaded host. A paused replica holds the webhook
	// calls and route calls it took (a guard it checked is answered
	// late), a paused kube-apiserver every request between its check and
	// its storage, a paused etcd every commit.
	FaultPauseManager   = "pause manager"
	FaultPauseAPIServer = "pause kube-apiserver"
	FaultPauseEtcd      = "pause etcd"
)

// Faults lists every kind, in the order a run takes them.
// FaultDroppedAnswer counts the holders' route calls whose answer the
// proxy dropped after a replica carried the call out (Config.DropAnswers):
// not a nemesis step, a steady rate.
const FaultDroppedAnswer = "answer dropped after the call was carried out"

var Faults = []string{FaultManager, FaultClient, FaultAPIServer, FaultEtcd, FaultSkew, FaultCutReplica, FaultCutClient, FaultCutWebhook, FaultPod,
	FaultPauseManager, FaultPauseAPIServer, FaultPauseEtcd}

// nemesis injects one fault after another, a random pause apart, until ctx
// ends; each fault is undone (restart, SIGCONT) and the system is back up
// before the next.
type nemesis struct {
	c      *cluster
	rand   *rand.Rand
	faults []string
	gap    [2]time.Duration // pause between faults, min and max
	pause  [2]time.Duration // how long a client stays stopped, min and max
	skew   time.Duration    // largest clock offset of a replica
	counts map[string]int
	logf   func(string, ...any)
}

func (n *nemesis) run(ctx context.Context) error {
	for i := 0; ; i++ {
		wait := n.gap[0] + time.Duration(n.rand.Int64N(int64(n.gap[1]-n.gap[0])+1))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		if err := n.revive(); err != nil {
			return err
		}
		f := n.faults[i%len(n.faults)]
		n.logf("fault: %s", f)
		switch err := n.inject(f); {
		case errors.Is(err, errNotApplicable):
			n.logf("  skipped: %v", err)
		case err != nil:
			return fmt.Errorf("%s: %w", f, err)
		default:
			n.counts[f]++
		}
	}
}

func (n *nemesis) inject(f string) error {
	c := n.c
	switch f {
	case FaultManager:
		r := c.replicas[n.rand.IntN(len(c.replicas))]
		return n.restart(r.p, func() error { return c.startReplica(r) })
	case FaultSkew:
		// Often one ahead and one behind, the pair the grace must cover.
		sign := int64(1)
		for _, r := range c.replicas {
			// Half the time the full skew, the case the grace is for.
			off := n.skew
			if n.rand.IntN(2) == 0 {
				off = time.Duration(n.rand.Int64N(int64(n.skew) + 1))
			}
			off *= time.Duration(sign)
			if n.rand.IntN(4) == 0 {
				off = -off
			}
			sign = -sign
			if err := skewclock.Write(r.clockFile, off); err != nil {
				return err
			}
			n.logf("  manager %d clock offset %s", r.id, off)
		}
		return nil
	case FaultCutReplica:
		// The other replica finishes foreground deletes meanwhile.
		r := c.replicas[n.rand.IntN(len(c.replicas))]
		return n.cut(r.api, 0)
	case FaultCutWebhook:
		return n.outage(func() error { return n.cut(c.webhooks, n.rand.IntN(len(c.replicas))) })
	case FaultCutClient:
		// The holder's, when a client holds the lock: its renewals and
		// release are cut off while its lease runs.
		i := n.rand.IntN(len(c.clients))
		if owner, _ := c.rec.holder(); owner != "" {
			if id, ok := clientOf(owner); ok && id < len(c.clients) {
				i = id
			}
		}
		return n.cut(c.routes[i], -1)
	case FaultPod:
		if len(c.podTokens) == 0 {
			return fmt.Errorf("the clients run in pods only with --auth=token: %w", errNotApplicable)
		}
		id := n.rand.IntN(len(c.podTokens))
		if owner, _ := c.rec.holder(); owner != "" {
			if h, ok := clientOf(owner); ok && h < len(c.podTokens) {
				id = h
			}
		}
		n.logf("  pod %s", podName(id))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return c.deletePod(ctx, id)
	case FaultPauseManager:
		r := c.replicas[n.rand.IntN(len(c.replicas))]
		n.logf("  manager %d", r.id)
		// Counted as an outage: the calls and webhook calls the paused
		// replica took wait for it, as during a cut.
		return n.outage(func() error { return n.stop(r.p, nil) })
	case FaultPauseAPIServer:
		return n.outage(func() error { return n.stop(c.apiserver, c.waitReady) })
	case FaultPauseEtcd:
		return n.outage(func() error { return n.stop(c.etcd, c.waitReady) })
	case FaultAPIServer:
		return n.outage(func() error { return n.restart(c.apiserver, func() error { return c.startReady(c.apiserver) }) })
	case FaultEtcd:
		return n.outage(func() error { return n.restart(c.etcd, func() error { return c.startReady(c.etcd) }) })
	case FaultClient:
		// Stop the holder, when a client holds the lock (any client
		// otherwise), for half its TTL up to TTL + 2 s or until just past
		// its lease's end: it may wake up within its lease, past it with
		// nobody in its place yet, or after a new holder has written.
		p := c.clients[n.rand.IntN(len(c.clients))]
		length := n.pause[0] + time.Duration(n.rand.Int64N(int64(n.pause[1]-n.pause[0])+1))
		if owner, expires := c.rec.holder(); owner != "" {
			if id, ok := clientOf(owner); ok && id < len(c.clients) {
				p = c.clients[id]
				// Wake it just after its lease ends, most of the time: the
				// moments around a takeover are where a stale write can
				// slip through.
				if n.rand.IntN(4) != 0 {
					length = time.Until(time.Unix(0, expires)) + time.Duration(n.rand.IntN(400))*time.Millisecond
				}
			}
		}
		if err := p.signal(syscall.SIGSTOP); err != nil {
			return err
		}
		time.Sleep(length)
		return p.signal(syscall.SIGCONT)
	}
	return fmt.Errorf("unknown fault %q", f)
}

// stop pauses p with SIGSTOP for 0.5 to 4 s, then continues it and
// waits for ready, when given.
func (n *nemesis) stop(p *proc, ready func() error) error {
	length := 500*time.Millisecond + time.Duration(n.rand.Int64N(int64(3500*time.Millisecond)+1))
	if err := p.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	n.logf("  stopped for %s", length.Round(time.Millisecond))
	time.Sleep(length)
	if err := p.signal(syscall.SIGCONT); err != nil {
		return err
	}
	if ready == nil {
		return nil
	}
	return ready()
}

// cut cuts backend b of p (every backend when b < 0) for 1 to 4 s.
func (n *nemesis) cut(p *proxy, b int) error {
	p.setCut(b, true)
	time.Sleep(time.Second + time.Duration(n.rand.Int64N(int64(3*time.Second))))
	p.setCut(b, false)
	return nil
}

// revive starts again a replica that exited by itself (a replica that
// loses its leader election Lease, cut off too long, exits), as its
// Deployment would.
func (n *nemesis) revive() error {
	for _, r := range n.c.replicas {
		if r.p.exited() {
			n.logf("manager %d exited by itself (see manager-%d-%d.log); starting it again", r.id, r.id, r.starts)
			n.counts["manager exited by itself"]++
			if err := n.c.startReplica(r); err != nil {
				return err
			}
		}
	}
	return nil
}

// outage records the time fault takes, from its start until what it broke
// is back (History.Outages).
func (n *nemesis) outage(fault func() error) error {
	from := time.Now().UnixNano()
	err := fault()
	n.c.rec.outage(from, time.Now().UnixNano())
	return err
}

// restart kills p, waits up to 1.5 s, and brings it back with start.
func (n *nemesis) restart(p *proc, start func() error) error {
	if err := p.kill(); err != nil {
		return err
	}
	time.Sleep(time.Duration(n.rand.IntN(1500)) * time.Millisecond)
	return start()
}

// ownerName names the owner of a client's cycle: "c<client>.<cycle>",
// unique per acquisition, which the checks rely on.
func ownerName(client, cycle int) string { return fmt.Sprintf("c%d.%d", client, cycle) }

// clientOf reads the client's number from an owner ownerName made.
func clientOf(owner string) (int, bool) {
	s, ok := strings.CutPrefix(owner, "c")
	if !ok {
		return 0, false
	}
	s, _, ok = strings.Cut(s, ".")
	if !ok {
		return 0, false
	}
	id, err := strconv.Atoi(s)
	return id, err == nil
}
