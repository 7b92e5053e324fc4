package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/test/internal/procfs"
)

// CPU time per cycle is the figure that a shared machine disturbs least:
// other engineers' work slows every row down, but it does not change how
// much CPU one cycle costs each process. It also says where the time goes.

// procs are the processes whose CPU time is measured: this run's
// kube-apiserver and etcd, found by the directories envtest gave them, and
// this process (the route, the webhooks, the manager and the clients).
type procs procfs.Procs

// cpuTimes is the CPU time (user and system) each process had used.
type cpuTimes struct {
	apiserver, etcd, self time.Duration
}

func (c cpuTimes) minus(o cpuTimes) cpuTimes {
	return cpuTimes{c.apiserver - o.apiserver, c.etcd - o.etcd, c.self - o.self}
}

func (c cpuTimes) total() time.Duration { return c.apiserver + c.etcd + c.self }

func (c cpuTimes) plus(o cpuTimes) cpuTimes {
	return cpuTimes{c.apiserver + o.apiserver, c.etcd + o.etcd, c.self + o.self}
}

// aboveIdle is c less what the processes use idle (per second) over secs,
// never below zero: the control plane's own loops and the manager's
// informer run whether or not anyone takes a lock, and a row that does
// fewer cycles in the same time would otherwise carry more of them each.
func (c cpuTimes) aboveIdle(idle cpuTimes, secs float64) cpuTimes {
	sub := func(a, b time.Duration) time.Duration {
		return max(0, a-time.Duration(float64(b)*secs))
	}
	return cpuTimes{sub(c.apiserver, idle.apiserver), sub(c.etcd, idle.etcd), sub(c.self, idle.self)}
}

// idleRate measures the CPU the processes use per second while the
// benchmark does nothing, over d.
func (p procs) idleRate(d time.Duration) cpuTimes {
	before := p.times()
	time.Sleep(d)
	used := p.times().minus(before)
	per := func(x time.Duration) time.Duration { return time.Duration(float64(x) / d.Seconds()) }
	return cpuTimes{per(used.apiserver), per(used.etcd), per(used.self)}
}

// settle waits, for at most limit, until kube-apiserver's CPU over a short
// sample is back within settleMargin a second of its idle use, and answers
// how long it waited. What a section leaves behind (the garbage of
// thousands of writes, the deletes of a fleet that closed, etcd's
// compaction) would otherwise be charged to the next row, and the first
// step of a renew load, at 25 renews a second, carries it the most: before
// this, the route's rows, which come right after the cycles, read up to
// twice a Lease's CPU per renew at 250 held and close to it at 3,000.
func (p procs) settle(idle cpuTimes, limit time.Duration) time.Duration {
	start := time.Now()
	for time.Since(start) < limit {
		if p.idleRate(2*time.Second).apiserver <= idle.apiserver+settleMargin {
			break
		}
	}
	return time.Since(start)
}

// settleMargin is how much above its idle use (per second) kube-apiserver
// may still be busy when a row starts: a few renews' worth.
const settleMargin = 30 * time.Millisecond

// findProcs finds this control plane's kube-apiserver and etcd.
func findProcs(env *controlplane.Env) (procs, error) {
	cp := env.Env.ControlPlane
	p, err := procfs.Find(cp.APIServer.CertDir, cp.Etcd.DataDir)
	return procs(p), err
}

func (p procs) times() cpuTimes {
	return cpuTimes{apiserver: procCPU(strconv.Itoa(p.APIServer)), etcd: procCPU(strconv.Itoa(p.Etcd)), self: procCPU("self")}
}

// clockTick is the unit of /proc/PID/stat's times (USER_HZ), 100 on Linux.
const clockTick = 10 * time.Millisecond

// procCPU reads the user and system time of a process from /proc; 0 when
// it cannot.
func procCPU(pid string) time.Duration {
	raw, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return 0
	}
	return parseStatCPU(string(raw))
}

// parseStatCPU reads utime and stime, the 14th and 15th fields of
// /proc/PID/stat. The second field, the command, is in parentheses and may
// hold spaces, so the fields are counted after its closing parenthesis.
func parseStatCPU(stat string) time.Duration {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(stat[i+1:])
	// After the command: state is field 3, so utime (14) is f[11].
	if len(f) < 13 {
		return 0
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(u+s) * clockTick
}

// perCycle writes CPU time per cycle in milliseconds.
func perCycle(d time.Duration, cycles int) string {
	if cycles == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000/float64(cycles))
}
