package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/queen-locks/queen-locks/locks"
)

// wantCalls are the API calls on queenlocks each operation may cost: at
// most this many, which is what a permit per slot and a webhook that
// stamps in the same write allow.
var wantCalls = map[string]float64{
	"acquire, free lock":             1,
	"renew":                          1,
	"release":                        1,
	"acquire, held by another owner": 2,
	"acquire, already held by the same owner": 2,
	"acquire, semaphore of 4 with room":       2,
	"get":                                     1,
	"check":                                   1,
	"release, semaphore slot":                 1,
	// A waiter's first try and its last (a create and a read each), and
	// for the direct transport its watch: nothing while nothing changes.
	waitingRow: 5,
	pollingRow: noTarget,
}

// noTarget marks a row shown for comparison only.
const noTarget = -1

var (
	waitingRow = fmt.Sprintf("acquire waiting %v on a held lock (waitSeconds; nothing changes)", waitedFor)
	pollingRow = fmt.Sprintf("the same %v, polling as before waitSeconds", waitedFor)
)

// offTarget lists the rows whose lock calls per operation exceed wantCalls.
func offTarget(rows []callRow) []string {
	var off []string
	for _, r := range rows {
		want, ok := wantCalls[r.op]
		if want == noTarget {
			continue
		}
		if got := sum(r.d.split(lockResources)) / float64(r.n); !ok || got > want+0.005 {
			off = append(off, fmt.Sprintf("%s, %s: %s calls", r.path, r.op, perOp(sum(r.d.split(lockResources)), r.n)))
		}
	}
	return off
}

// renewTarget is the renew load the route must carry: this many held
// permits with a p99 under renewTargetP99.
const (
	renewTarget    = 2000
	renewTargetP99 = 100 * time.Millisecond
)

// write says, from this run's own figures, which targets it met: calls,
// throughput, auth and renew load first, then cost and handoff.
func (s summary) write() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n## Against the targets for calls, throughput, auth and renew load, in this run\n\n")
	if s.callsRun {
		if len(s.callsOff) == 0 {
			fmt.Fprintf(&b, "- **API calls per operation:** met on every path: 1 for an acquire of a free lock, a renew and a release; at most 2 for an acquire of a held lock; 2 for a semaphore acquire with room; 1 read for get and check.\n")
		} else {
			fmt.Fprintf(&b, "- **API calls per operation:** not met: %s.\n", strings.Join(s.callsOff, "; "))
		}
	}
	if s.tokenVs != nil {
		verdict := "not met"
		if s.ratio8 >= 0.6 {
			verdict = "met"
		}
		fmt.Fprintf(&b, "- **Route cycles at 8 clients at least 0.6 of the Lease baseline** (0.30 before one call per operation): %s, %.2f. "+
			"The CRD copy with no webhook and no informer reached %.2f in the same rounds: that is the most any lock kept in a custom resource gets here.\n", verdict, s.ratio8, s.floor8)
		worst := 1.0
		for _, r := range s.tokenSteady {
			worst = min(worst, r)
		}
		verdict = "not met"
		if s.tokenSteady != nil && worst >= 0.9 {
			verdict = "met"
		}
		fmt.Fprintf(&b, "- **Token auth within 10%% of no auth:** %s for callers that keep calling (%.2f, %.2f and %.2f at 1, 8 and 32 clients). "+
			"In the five-path rounds, where each token round starts with its reviews expired: %.2f, %.2f and %.2f; "+
			"a cycle with token auth cost %.2f times the CPU of one without at 8 clients.\n", verdict, s.tokenSteady[1], s.tokenSteady[8], s.tokenSteady[32],
			s.tokenVs[1], s.tokenVs[8], s.tokenVs[32], s.tokenCPU8)
	}
	if s.renewP99 != nil {
		p99, ok := s.renewP99[renewTarget]
		switch {
		case !ok:
			fmt.Fprintf(&b, "- **Renew load, %d held permits with p99 under %s** (%s before): not met; the steps stopped before %d, ", renewTarget, ms(renewTargetP99), "322.2 ms", renewTarget)
		case p99 < renewTargetP99:
			fmt.Fprintf(&b, "- **Renew load, %d held permits with p99 under %s** (%s before): met, %s; ", renewTarget, ms(renewTargetP99), "322.2 ms", ms(p99))
		default:
			fmt.Fprintf(&b, "- **Renew load, %d held permits with p99 under %s** (%s before): not met, %s; ", renewTarget, ms(renewTargetP99), "322.2 ms", ms(p99))
		}
		fmt.Fprintf(&b, "the largest step under %s: %d held permits.", ms(renewBound), s.renewLargest)
		var lease []string
		for _, n := range renewSteps {
			if d, ok := s.leaseP99[n]; ok {
				lease = append(lease, fmt.Sprintf("%s at %d", ms(d), n))
			}
		}
		if len(lease) > 0 {
			fmt.Fprintf(&b, " Plain Leases renewed at the same rates had a p99 of %s.", strings.Join(lease, ", "))
		}
		fmt.Fprintln(&b)
	}
	b.WriteString(s.costTargets())
	b.WriteString(s.externalTargetsMet())
	b.WriteString(s.fenceElectionPage())
	b.WriteString(s.lineTargets())
	return b.String()
}

// The line's bounds (docs/line.md): a waiter whose carrier stopped leaves
// within its ttlSeconds and two sweeps after its last renew (one to see
// that version, one past the ttl), so within that from the stop; one
// whose caller hung up at once, here under a second.
const (
	lineStopBound = locks.WaiterTTL + 2*time.Second
	lineGoneBound = time.Second
)

// lineTargets says how the line's leaves kept docs/line.md's bounds, and
// the semaphore's handoff p99 to the lock's against twice the lock's.
func (s summary) lineTargets() string {
	if s.line == nil {
		return ""
	}
	l := s.line
	var b strings.Builder
	fmt.Fprintf(&b, "\n## The line, against its bounds, in this run\n\n")
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "not met"
	}
	most := func(d []time.Duration) time.Duration { return percentile(d, 100) }
	fmt.Fprintf(&b, "- **A waiter whose route replica stopped leaves the line within ttlSeconds and two sweeps (%s) of the stop:** %s, at most %s over %d.\n",
		lineStopBound, verdict(most(l.stopLeft) <= lineStopBound), ms(most(l.stopLeft)), len(l.stopLeft))
	fmt.Fprintf(&b, "- **A waiter whose caller hung up leaves the line at once (under %s):** %s, at most %s over %d.\n",
		lineGoneBound, verdict(most(l.goneLeft) < lineGoneBound), ms(most(l.goneLeft)), len(l.goneLeft))
	fmt.Fprintf(&b, "- **The semaphore's handoff p99 at most %.0f times the lock's** (waiters over two replicas, the median of the rounds): %s, %s (p99 %s against %s over all rounds).\n",
		lineHandoffRatio, verdict(l.ratio.med <= lineHandoffRatio), l.ratio, ms(l.semP99), ms(l.lockP99))
	return b.String()
}

// fenceElectionPage says what the bound, election and dashboard sections
// found, from their rows: what the fence's raise adds to an acquire, what
// package election costs beside client-go's Lease lock, and how the Locks
// page keeps up.
func (s summary) fenceElectionPage() string {
	if s.bound == nil && s.electionCPU == nil && s.page == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## Fencing, leader election and the Locks page, in this run\n\n")
	if s.bound != nil {
		fmt.Fprintf(&b, "- **An acquire's raise of its slot's bound objects:** an acquire's p50 with 1 and 10 bound objects was %.2f and %.2f times one with none (p99 %.2f and %.2f).\n",
			s.bound[1][0], s.bound[10][0], s.bound[1][1], s.bound[10][1])
	}
	if s.electionCPU != nil {
		fmt.Fprintf(&b, "- **A leader's renew, package election to client-go's Lease lock at the same retry period:** %s times the kube-apiserver CPU per renew (median of the rounds, least to most).\n", s.electionCPU)
	}
	if s.fencedP50 > 0 {
		fmt.Fprintf(&b, "- **A fenced write to a plain one, at 8 writers:** p50 %.2f, p99 %.2f times.\n", s.fencedP50, s.fencedP99)
	}
	if s.page != nil {
		fmt.Fprintf(&b, "- **The Locks page:** %d rows rendered %s after it was opened; at %d renews a second, a renew showed on the page %s after its answer at p50, %s at p99.\n",
			s.page.Permits, msf(s.page.RenderMs), s.page.Rate, msf(s.page.LagP50Ms), msf(s.page.LagP99Ms))
	}
	return b.String()
}

// The targets for the route's cycles, with the clients in their own
// process, to the floor's in the same rounds (the median of the rounds),
// by clients.
var externalTargets = []struct {
	conc int
	want float64
}{{8, 0.95}, {32, 0.9}}

// externalTargetsMet says how the route's cycles, with its callers in a process of
// their own, compared with the floor's.
func (s summary) externalTargetsMet() string {
	if s.external == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## The route as users run it, against its targets, in this run\n\n")
	for _, t := range externalTargets {
		h, p := s.external.handle[t.conc], s.external.plain[t.conc]
		verdict := "not met"
		if h.med >= t.want && p.med >= t.want {
			verdict = "met"
		}
		fmt.Fprintf(&b, "- **Route cycles at %d clients in their own process at least %.2f of the floor's** (median of the rounds): %s; "+
			"the Go handle %s, the plain HTTP/1.1 client %s.\n", t.conc, t.want, verdict, h, p)
	}
	return b.String()
}

// Targets beside renew cost: route cycles at 8 clients at
// least cycleFloorTarget of the CRD copy's, and a semaphore's handoff to
// waiters with a p99 under handoffTarget and below polling's.
const (
	cycleFloorTarget = 0.9
	handoffTarget    = 50 * time.Millisecond
)

// costTargets says which targets of renew cost, route cycles and
// handoff this run measured and met.
func (s summary) costTargets() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n## Against the targets for renew cost, route cycles and handoff, in this run\n\n")
	if s.renewP99 != nil {
		b.WriteString(s.renewCost())
	}
	if s.tokenVs != nil && s.floor8 > 0 {
		r := s.ratio8 / s.floor8
		verdict := "not met"
		if r >= cycleFloorTarget {
			verdict = "met"
		}
		fmt.Fprintf(&b, "- **Route cycles at 8 clients at least %.1f of the CRD copy's:** %s, %.2f (%.2f and %.2f of the Lease baseline).\n", cycleFloorTarget, verdict, r, s.ratio8, s.floor8)
	}
	if s.semWait != nil && s.semPoll != nil {
		verdict := "not met"
		if s.semWait.p99 < handoffTarget && s.semWait.p99 < s.semPoll.p99 {
			verdict = "met"
		}
		fmt.Fprintf(&b, "- **Semaphore handoff to waiters (4 slots, 16 waiters) with a p99 under %s and below polling's:** %s, p99 %s (p50 %s) against polling's %s (p50 %s).\n",
			ms(handoffTarget), verdict, ms(s.semWait.p99), ms(s.semWait.p50), ms(s.semPoll.p99), ms(s.semPoll.p50))
	}
	return b.String()
}

// Renew targets: kube-apiserver CPU per renew through the
// route at most renewCostTarget times a Lease renew's in the same run, and
// renewLoadTarget held permits renewed with a p99 under renewBound.
const (
	renewCostTarget = 1.5
	renewLoadTarget = 3000
)

// renewCost says how the route's renews compared with Leases' in
// kube-apiserver's CPU, step by step, and whether the load step held: the
// renew lines of costTargets.
func (s summary) renewCost() string {
	var b strings.Builder
	var vsPatch, vsUpdate, vsFloor []string
	worst := 0.0
	for _, n := range renewSteps {
		route, ok1 := s.renewCPU[n]
		lease, ok2 := s.leaseCPU[n]
		if !ok1 || !ok2 || lease <= 0 {
			continue
		}
		worst = max(worst, route/lease)
		vsPatch = append(vsPatch, fmt.Sprintf("%.2f at %d", route/lease, n))
		if u := s.leaseUpdateCPU[n]; u > 0 {
			vsUpdate = append(vsUpdate, fmt.Sprintf("%.2f at %d", route/u, n))
		}
		if f := s.floorCPU[n]; f > 0 {
			vsFloor = append(vsFloor, fmt.Sprintf("%.2f at %d", route/f, n))
		}
	}
	if len(vsPatch) == 0 {
		fmt.Fprintf(&b, "- **kube-apiserver CPU per renew at most %.1f times a Lease renew's:** not measured.\n", renewCostTarget)
	} else {
		verdict := "not met"
		if worst <= renewCostTarget {
			verdict = "met"
		}
		fmt.Fprintf(&b, "- **kube-apiserver CPU per renew at most %.1f times a Lease renew's** (1.9 before): %s; the route's to a Lease renewed by merge patch: %s. "+
			"To a Lease renewed by update, as client-go's leader election renews: %s. To the CRD copy renewed by the same update: %s.\n",
			renewCostTarget, verdict, strings.Join(vsPatch, ", "), strings.Join(vsUpdate, ", "), strings.Join(vsFloor, ", "))
	}
	switch p99, ok := s.renewP99[renewLoadTarget]; {
	case !ok:
		fmt.Fprintf(&b, "- **Renew load, %d held permits with p99 under %s** (494 ms before): not measured; the steps stopped before %d.\n", renewLoadTarget, ms(renewBound), renewLoadTarget)
	case p99 < renewBound:
		fmt.Fprintf(&b, "- **Renew load, %d held permits with p99 under %s** (494 ms before): met, %s.\n", renewLoadTarget, ms(renewBound), ms(p99))
	default:
		fmt.Fprintf(&b, "- **Renew load, %d held permits with p99 under %s** (494 ms before): not met, %s.\n", renewLoadTarget, ms(renewBound), ms(p99))
	}
	return b.String()
}
