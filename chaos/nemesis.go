package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Faults the nemesis injects.
const (
	FaultManager   = "kill manager"
	FaultClient    = "pause client"
	FaultAPIServer = "kill kube-apiserver"
	FaultEtcd      = "kill etcd"
)

// Faults lists every kind, in the order a run takes them.
var Faults = []string{FaultManager, FaultClient, FaultAPIServer, FaultEtcd}

// nemesis injects one fault after another, a random pause apart, until ctx
// ends; each fault is undone (restart, SIGCONT) and the system is back up
// before the next.
type nemesis struct {
	c      *cluster
	rand   *rand.Rand
	faults []string
	gap    [2]time.Duration // pause between faults, min and max
	pause  time.Duration    // how long a client stays stopped
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
		f := n.faults[i%len(n.faults)]
		n.logf("fault: %s", f)
		if err := n.inject(f); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		n.counts[f]++
	}
}

func (n *nemesis) inject(f string) error {
	c := n.c
	switch f {
	case FaultManager:
		if err := c.manager.kill(); err != nil {
			return err
		}
		time.Sleep(time.Duration(n.rand.IntN(1500)) * time.Millisecond)
		return c.startManager()
	case FaultAPIServer:
		if err := c.apiserver.kill(); err != nil {
			return err
		}
		time.Sleep(time.Duration(n.rand.IntN(1500)) * time.Millisecond)
		if err := c.apiserver.start(); err != nil {
			return err
		}
		return c.waitReady()
	case FaultEtcd:
		if err := c.etcd.kill(); err != nil {
			return err
		}
		time.Sleep(time.Duration(n.rand.IntN(1500)) * time.Millisecond)
		if err := c.etcd.start(); err != nil {
			return err
		}
		return c.waitReady()
	case FaultClient:
		// Stop the holder, when a client holds the lock: it wakes up past
		// its lease with a token somebody else may have replaced.
		p := c.clients[n.rand.IntN(len(c.clients))]
		if id, ok := clientOf(c.rec.holder()); ok && id < len(c.clients) {
			p = c.clients[id]
		}
		if err := p.signal(syscall.SIGSTOP); err != nil {
			return err
		}
		time.Sleep(n.pause)
		return p.signal(syscall.SIGCONT)
	}
	return fmt.Errorf("unknown fault %q", f)
}

// clientOf reads the client's number from an owner "c<client>.<cycle>".
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
