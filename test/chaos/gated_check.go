package main

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// GatedFigures are what the checks found of the gated pods.
type GatedFigures struct {
	Holds int // holds recorded
	// Empty holds ended before they began: the client chose to delete a
	// pod that still looked gated, and the line let it in meanwhile.
	Empty int
	// ByLock counts the holds of each lock.
	ByLock map[string]int
	// Permits counts the permit versions taken for gated pods (acquires
	// and any renewals), which the lock's checks see as operations.
	Permits int
	// Most is, per lock, the most holders at once, gated pods and the
	// route's holders (by the answers) together.
	Most map[string]int
	// Shapes counts the holds of each shape of pod (gated_shapes.go).
	Shapes map[string]int
}

// gatedLock is a lock whose permits are recorded (the lock and the
// semaphore, the two gated pods wait for): its name, its Op.Lock, its
// limit and its record.
type gatedLock struct {
	name, op string
	limit    int
	evs      []Event
}

func lockRecords(h History) []gatedLock {
	return []gatedLock{{Lock, "", 1, h.Permits}, {Semaphore, Semaphore, SemaphoreLimit, h.SemPermits}}
}

func isGatedOwner(owner string) bool { return strings.HasPrefix(owner, "pod:") }

// gatedClient is the client number of the operations gatedOps makes.
const gatedClient = -1000

// revokedBefore tells whether a revoke by someone else than a gated pod's
// end (kubectl delete of the permit, or a holder client's pod deleted)
// named version and may have deleted it by seen.
func revokedBefore(ops []Op, version uint64, seen int64) bool {
	for _, op := range ops {
		if op.Kind == KindRevoke && op.Role != RoleGated && op.Token == version && op.Call < seen &&
			(op.Outcome == Released || op.Outcome == Unknown) {
			return true
		}
	}
	return false
}

// gatedOps are the lock operations the record shows the manager made for
// gated pods, so that the lock's checks see gated pods as the holders they
// are: an acquire for each permit version that begins a gated pod's lease
// (sent no earlier than its stamp allows, answered by the time the watch
// saw it), a renew for any later version of it, and a revoke for its end,
// unless someone else's revoke may have been it. The end was sent no
// earlier than the pod's recorded end: the manager frees the permit after
// it has seen the pod end, and the client recorded the end before it sent
// the write that ends the pod.
func gatedOps(h History) []Op {
	ends := map[string]int64{} // owner -> the recorded end of its hold
	clients := map[string]int{}
	for _, x := range h.Holds {
		ends[gatedOwner(x.UID)] = x.End
		clients[gatedOwner(x.UID)] = gatedClient - x.Client
	}
	client := func(owner string) int {
		if c, ok := clients[owner]; ok {
			return c
		}
		return gatedClient
	}
	var out []Op
	for _, l := range lockRecords(h) {
		live := map[int]*Event{} // slot -> its live version, of any owner
		acquired := map[int]Op{} // slot -> the acquire of its live gated lease
		for i := range l.evs {
			e := &l.evs[i]
			prev := live[e.Slot]
			if e.Type == "DELETED" || e.Deleting {
				if prev != nil && isGatedOwner(prev.Owner) && !revokedBefore(h.Ops, prev.Version, e.Seen) {
					call := acquired[e.Slot].Call
					if end, ok := ends[prev.Owner]; ok && end > call && end < e.Seen {
						call = end
					}
					out = append(out, Op{Client: client(prev.Owner), Role: RoleGated, Lock: l.op, Slot: e.Slot, Kind: KindRevoke, Owner: prev.Owner,
						Token: prev.Version, Call: call, Return: e.Seen, Outcome: Released})
				}
				delete(live, e.Slot)
				continue
			}
			live[e.Slot] = e
			if !isGatedOwner(e.Owner) {
				continue
			}
			op := Op{Client: client(e.Owner), Role: RoleGated, Lock: l.op, Slot: e.Slot, Owner: e.Owner, Return: e.Seen,
				NewToken: e.Version, ExpiresAt: e.ExpireTime}
			if l.limit > 1 {
				op.Limit = l.limit
			}
			if prev == nil || prev.Owner != e.Owner || prev.AcquireTime != e.AcquireTime || e.Type == "ADDED" {
				op.Kind, op.Outcome = KindAcquire, Acquired
				op.TTL = seconds(e.ExpireTime - e.AcquireTime)
				op.Call = min(e.AcquireTime-h.Skew, e.Seen)
				acquired[e.Slot] = op
			} else {
				op.Kind, op.Outcome, op.Token = KindRenew, Renewed, prev.Version
				op.TTL = seconds(e.ExpireTime - e.RenewTime)
				op.Call = min(e.RenewTime-h.Skew, e.Seen)
			}
			out = append(out, op)
		}
	}
	return out
}

// seconds is a span of ns in whole seconds, as a TTL is.
func seconds(ns int64) int64 { return int64(math.Round(float64(ns) / float64(time.Second))) }

// span is one holder's time with a lock, as the checks bound it: no later
// than it began and no earlier than it ended, by the machine's clock.
type span struct {
	who         string
	gated       bool
	slot        int
	start, end  int64
	first, last uint64 // tokens
}

func (s span) String() string {
	kind := "route holder"
	if s.gated {
		kind = "gated pod"
	}
	tokens := fmt.Sprintf("token %d", s.first)
	if s.last != s.first {
		tokens = fmt.Sprintf("tokens %d..%d", s.first, s.last)
	}
	return fmt.Sprintf("%s %s (slot %d, %s, %s..%s)", kind, s.who, s.slot, tokens, stamp(s.start), stamp(s.end))
}

// checkGated: every gated pod's hold is of a permit version held for that
// pod, with the token the pod was given; no permit of a gated pod is freed
// before the pod ended (but by a revoke); and with the route's holders, no
// more holders than the limit at once, and in each slot one holder after
// the other with tokens going up.
//
// A gated pod holds from when its client's watch saw the gate removed to
// when the client chose to end it, both on the machine's clock. A route
// holder holds, by the answers, from its acquire's stamp to its last
// answered expiry, its release's call or a revoke's; stamps come from a
// replica whose clock is off by up to the skew, so the span is narrowed
// by the skew at both ends where it rests on one. Every span then lies
// inside its permit's life, and permits of one slot follow each other:
// two spans of one slot that overlap, or more spans at once than the
// limit, mean two holders where there was room for one. Only the cases
// with a gated pod among them are reported here; the lock's and the
// semaphore's own checks judge the route's holders among themselves.
func (r *Report) checkGated(h History, b bounds) {
	g := &r.Gated
	g.Holds, g.ByLock, g.Most, g.Shapes = len(h.Holds), map[string]int{}, map[string]int{}, map[string]int{}
	for _, op := range h.Ops {
		if op.Role == RoleGated && (op.Kind == KindAcquire || op.Kind == KindRenew) {
			g.Permits++
		}
	}
	revokes := map[string][]int64{} // owner -> calls of revokes of its permit by others
	for _, op := range h.Ops {
		if op.Kind == KindRevoke && op.Role != RoleGated && (op.Outcome == Released || op.Outcome == Unknown) {
			revokes[op.Owner] = append(revokes[op.Owner], op.Call)
		}
	}
	for _, l := range lockRecords(h) {
		var spans []span
		for _, x := range h.Holds {
			if x.Lock != l.name {
				continue
			}
			g.ByLock[l.name]++
			if x.End <= x.Start {
				g.Empty++
			}
			if !r.checkHold(h, l, x) {
				continue
			}
			s := span{who: fmt.Sprintf("%s (%s)", x.Pod, gatedOwner(x.UID)), gated: true, slot: x.Slot, start: x.Start, end: x.End, first: x.Token, last: x.Token}
			for _, call := range revokes[gatedOwner(x.UID)] {
				s.end = min(s.end, call)
			}
			spans = append(spans, s)
		}
		spans = append(spans, routeSpans(h, l.op, b)...)
		r.checkSpans(l, spans)
	}
}

// checkHold checks one hold against its lock's record: its token is a
// version held for its pod in its slot, and that lease was not freed
// before the pod ended (unless revoked). It answers whether the hold has a
// token at all.
func (r *Report) checkHold(h History, l gatedLock, x Hold) bool {
	owner := gatedOwner(x.UID)
	if x.Token == 0 {
		r.violate(fmt.Sprintf("gated: %s was let in without a token: a labelled pod ran without its lock", x))
		return false
	}
	i := sort.Search(len(l.evs), func(i int) bool { return l.evs[i].Version >= x.Token })
	if i == len(l.evs) || l.evs[i].Version != x.Token {
		r.violate(fmt.Sprintf("gated: %s carries a token that is no recorded version of %s", x, l.name))
		return true
	}
	e := l.evs[i]
	if e.Owner != owner || e.Slot != x.Slot || e.Type == "DELETED" || e.Deleting {
		r.violate(fmt.Sprintf("gated: %s carries token %d, but that version of %s is %s of owner %s, slot %d", x, x.Token, l.name, e.Type, e.Owner, e.Slot))
		return true
	}
	r.checkShape(x, e)
	if x.How == EndGone {
		return true // its end is only when the watch saw it go
	}
	for _, f := range l.evs[i+1:] {
		if f.Slot != e.Slot {
			continue
		}
		if f.Type != "DELETED" && !f.Deleting && f.Owner == e.Owner && f.AcquireTime == e.AcquireTime {
			continue // the same lease
		}
		if f.Seen < x.End && !revokedLease(h, l, i, f.Seen) {
			r.violate(fmt.Sprintf("gated: the permit of %s was freed or replaced (version %d, %s, seen %s) before the pod ended at %s",
				x, f.Version, f.Type, stamp(f.Seen), stamp(x.End)))
		}
		break
	}
	return true
}

// revokedLease tells whether a revoke named any version of the lease that
// l.evs[i] belongs to, sent before seen.
func revokedLease(h History, l gatedLock, i int, seen int64) bool {
	e := l.evs[i]
	for _, f := range l.evs[i:] {
		if f.Slot != e.Slot {
			continue
		}
		if f.Type == "DELETED" || f.Deleting || f.Owner != e.Owner || f.AcquireTime != e.AcquireTime {
			break
		}
		if revokedBefore(h.Ops, f.Version, seen) {
			return true
		}
	}
	return false
}

// routeSpans are the route's holders of the lock whose Op.Lock is lock, by
// the answers.
func routeSpans(h History, lock string, b bounds) []span {
	leases := map[string]*span{}
	var owners []string
	for _, op := range h.Ops {
		if op.Lock != lock || op.Role == RoleGated {
			continue
		}
		switch op.Kind + "/" + op.Outcome {
		case KindAcquire + "/" + Acquired, KindAcquire + "/" + Already, KindRenew + "/" + Renewed:
			start := op.ExpiresAt - op.TTL*int64(time.Second)
			s := leases[op.Owner]
			if s == nil {
				s = &span{who: op.Owner, slot: op.Slot, start: start, end: op.ExpiresAt, first: op.NewToken, last: op.NewToken}
				leases[op.Owner] = s
				owners = append(owners, op.Owner)
			}
			s.start, s.end = min(s.start, start), max(s.end, op.ExpiresAt)
			s.first, s.last = min(s.first, op.NewToken), max(s.last, op.NewToken)
		}
	}
	ends := map[string]int64{}
	for _, op := range h.Ops {
		if op.Lock != lock || op.Role == RoleGated || (op.Kind != KindRelease && op.Kind != KindRevoke) ||
			(op.Outcome != Released && op.Outcome != Unknown) {
			continue
		}
		if end, ok := ends[op.Owner]; !ok || op.Call < end {
			ends[op.Owner] = op.Call
		}
	}
	out := make([]span, 0, len(owners))
	for _, o := range owners {
		s := *leases[o]
		s.start += b.skew
		s.end -= b.skew
		if end, ok := ends[o]; ok {
			s.end = min(s.end, end)
		}
		out = append(out, s)
	}
	return out
}

// checkSpans: never more holders of l than its limit at once, and one
// after the other in each slot, in the order of their tokens; reported
// where a gated pod is among them.
func (r *Report) checkSpans(l gatedLock, spans []span) {
	type edge struct {
		at    int64
		delta int
		i     int
	}
	var edges []edge
	var held []span
	for _, s := range spans {
		if s.end > s.start {
			held = append(held, s)
		}
	}
	for i, s := range held {
		edges = append(edges, edge{s.start, 1, i}, edge{s.end, -1, i})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at != edges[j].at {
			return edges[i].at < edges[j].at
		}
		return edges[i].delta < edges[j].delta // an end before a start at the same instant
	})
	live := map[int]bool{}
	reported := false
	for _, e := range edges {
		if e.delta > 0 {
			live[e.i] = true
		} else {
			delete(live, e.i)
		}
		r.Gated.Most[l.name] = max(r.Gated.Most[l.name], len(live))
		if len(live) <= l.limit || reported {
			continue
		}
		var who []string
		gated := false
		for i := range live {
			who = append(who, held[i].String())
			gated = gated || held[i].gated
		}
		if gated {
			reported = true
			sort.Strings(who)
			r.violate(fmt.Sprintf("gated: %d holders of %s (limit %d) at %s: %s", len(live), l.name, l.limit, stamp(e.at), strings.Join(who, "; ")))
		}
	}
	bySlot := map[int][]span{}
	for _, s := range held {
		bySlot[s.slot] = append(bySlot[s.slot], s)
	}
	for slot, ss := range bySlot {
		sort.SliceStable(ss, func(i, j int) bool { return ss[i].first < ss[j].first })
		for i := 1; i < len(ss); i++ {
			a, b := ss[i-1], ss[i]
			if !a.gated && !b.gated {
				continue
			}
			switch {
			case b.first <= a.last:
				r.violate(fmt.Sprintf("gated: tokens of %s slot %d do not go up: %s, then %s", l.name, slot, a, b))
			case b.start < a.end:
				r.violate(fmt.Sprintf("gated: %s slot %d had two holders at once: %s, and from %s %s", l.name, slot, a, stamp(b.start), b))
			}
		}
	}
}

// printGated writes the gated pods' figures as rows of the report.
func printGated(row func(string, int), g GatedFigures) {
	row("gated pods' holds recorded", g.Holds)
	for _, l := range []string{Lock, Semaphore} {
		row("  of "+l, g.ByLock[l])
	}
	row("  of them empty (deleted while it looked gated, let in meanwhile)", g.Empty)
	row("permit versions taken for gated pods", g.Permits)
	row(fmt.Sprintf("most holders of %s at once, gated pods and route holders (limit 1)", Lock), g.Most[Lock])
	row(fmt.Sprintf("most holders of %s at once, gated pods and route holders (limit %d)", Semaphore, SemaphoreLimit), g.Most[Semaphore])
	for _, s := range []string{"plain", ShapeLimitOne, ShapeHugeGrace, ShapeManyAnnotations, ShapeUnadmittable} {
		row("  holds of "+s+" pods", g.Shapes[s])
	}
}
