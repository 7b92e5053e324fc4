package main

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"
)

// The line (docs/line.md): every acquire that waits is a QueenLockWaiter,
// and the line of a lock is its waiters in the order of their creates'
// resourceVersions. The recorder keeps every version of every waiter, and
// of the lock's and the semaphore's permits, in etcd's one order; the
// gated clients record their pods' queued-at, and when a pod was told it
// cannot be let in or went. checkLine puts them together:
//
//   - the order: each lease that begins (a permit created, or taken over,
//     for an owner) is checked against the line as it stood at that
//     version: every waiter still in it that could use the slot (its limit
//     above the slot), that had not been served yet and is ahead of the new
//     holder (by place; the new holder's place is its own waiter's, or
//     none: a plain acquire is behind everyone) was passed. Each pass is a
//     violation unless one of the exceptions docs/line.md names explains
//     it (lineRules): each exception is one named rule, counted.
//   - gated pods that can be let in are: a slot of a lock that stays free
//     while a gated pod heads the line of those who could use it, for more
//     than admitWithin of time in which a leader ran and the control plane
//     was up, is a violation; and a pod that cannot be let in is told why
//     (its condition) and holds nobody back (the same check: once told, it
//     no longer heads anything).
//
// A paused or cut-off carrier that loses its place needs no rule: its
// waiter is swept (deleted), so it is no longer in the line, and its new
// waiter has a later place.

// Exceptions to the line's order, each one of docs/line.md's "What can
// reorder it, and by how much".
const (
	// RuleGap: a plain acquire's create of a slot that a release (an
	// expiry, a holder pod's end) left free lands before the first
	// waiter's. docs/line.md, "The gap after a release". Drop it from
	// lineRules once a freed permit is handed to the first waiter in place.
	RuleGap = "the gap after a release"
	// RuleJoinedDuring: the passed waiter joined the line after the plain
	// acquire that passed it was sent: it was not "already waiting" (an
	// acquire that does not wait does not pass anyone already waiting).
	RuleJoinedDuring = "joined while the passing acquire was in flight"
	// RuleQueuedAt: gated pods among themselves go in the order of their
	// queued-at (then UID), which two replicas stamp with clocks up to
	// twice the skew apart: a pod queued less than that before another
	// may go after it. docs/line.md, "Gated pods among themselves".
	RuleQueuedAt = "gated pods queued within the replicas' skew of each other"
	// RuleBehindAnother: a gated pod whose place is behind a waiter of
	// another kind (a route call, a handle) waits for it, and gated pods
	// queued after it but placed ahead of that waiter go first: a pod's
	// place is its waiter's, made when the leader first saw it waiting in
	// the line (after its other scheduling gates, or after a refusal).
	// docs/line.md, "Gated pods among themselves".
	RuleBehindAnother = "a gated pod placed behind another kind's waiter"
	// RuleNotAdmitted: a pod the manager cannot let in is passed over
	// (docs/gated-pods.md, "Admitted"), once it is told why.
	RuleNotAdmitted = "a pod that cannot be let in is passed over"
	// RulePodGone: a gated pod deleted leaves the line, though its waiter
	// is deleted a moment later, by the leader.
	RulePodGone = "the waiting pod was deleted"
	// RuleOutside: an acquire that waited with no waiter of its own (a
	// route replica whose caches had not synced) waits outside the line,
	// in no promised order. docs/line.md, "Outside the line".
	RuleOutside = "waited outside the line"
	// RuleLeaderChange: gated pods passed among themselves while the
	// leader changed (two gates, the old one not yet stopped, each with
	// its own view): docs/line.md, "A leader change".
	RuleLeaderChange = "a leader change (gated pods)"
)

// lineRules are the exceptions checkLine allows; a pass no rule of this
// list explains is a violation.
var lineRules = []string{RuleGap, RuleJoinedDuring, RuleQueuedAt, RuleBehindAnother, RuleNotAdmitted, RulePodGone, RuleOutside, RuleLeaderChange}

// admitWithin bounds how long a gated pod may head the line of a free slot
// it could use, counting only time in which a leader ran and the control
// plane was up: docs/gated-pods.md wakes the line at a permit's delete, a
// waiter's leave or a takeover's moment, so it takes a watch delivery, an
// acquire and a patch (milliseconds); but a pod whose ServiceAccount's
// rights a just-restarted API server denied is looked at again only after
// 10 s (controllers/gate, retryLater), and a new leader first syncs its
// caches. The time without a leader is bounded apart, by the lease: a
// leader that stops renewing is replaced within ManagerLeaseDuration plus
// a ManagerRetryPeriod (docs/line.md, "A leader change").
const admitWithin = 12 * time.Second

// leaderStall is how long between two renewals of the manager's Lease
// counts as time without a leader: the leader renews every
// ManagerRetryPeriod, and one renewal late (a slow API server) is not yet
// a leader gone.
const leaderStall = ManagerRetryPeriod + time.Second

// LineFigures are what checkLine found.
type LineFigures struct {
	Waiters     int // waiters recorded (creates)
	GatedWaits  int // of them, gated pods'
	Leases      int // leases begun while waiters stood in the line
	FromLine    int // of them, taken by a waiter (its own waiter in the line)
	Passes      int // waiters passed, each time
	Excused     map[string]int
	Unexcused   int
	LongestGap  int64 // longest a slot stayed free before a plain create passed the line (ns)
	LongestHead int64 // longest time a gated pod headed a free slot's line, counted as for admitWithin (ns)
	NotAdmitted int   // gated pods told they cannot be let in
	Positions   int   // waiters whose carrier recorded spec.position
}

// waiterSpan is one waiter's time in the line.
type waiterSpan struct {
	uid, lock, owner, pod string
	limit                 int
	pos                   uint64 // its create's version: its place
	created, gone         int64  // seen
	goneV                 uint64 // 0: never deleted
}

func (w waiterSpan) String() string {
	who := "waiter of " + w.owner
	if w.pod != "" {
		who = "gated pod's waiter of " + w.owner
	}
	return fmt.Sprintf("%s (place %d, limit %d, in line %s..%s)", who, w.pos, w.limit, stamp(w.created), stamp(w.gone))
}

func waiterSpans(h History) (map[string][]*waiterSpan, int) {
	by := map[string]*waiterSpan{}
	var order []*waiterSpan
	positions := 0
	for _, e := range h.Waiters {
		w := by[e.UID]
		if w == nil {
			if e.Type != "ADDED" {
				continue // made before the record began
			}
			w = &waiterSpan{uid: e.UID, lock: e.Lock, owner: e.Owner, pod: e.Pod, limit: e.Limit, pos: e.Version, created: e.Seen}
			by[e.UID] = w
			order = append(order, w)
		}
		if e.Type == "DELETED" {
			w.gone, w.goneV = e.Seen, e.Version
		}
		if e.Position != 0 && w.pos != e.Position {
			// Recorded by the carrier; a wrong one would move the waiter.
			w.pos = 0
		}
	}
	out := map[string][]*waiterSpan{}
	for _, w := range order {
		out[w.lock] = append(out[w.lock], w)
	}
	for _, e := range h.Waiters {
		if e.Position != 0 && e.Type == "MODIFIED" {
			positions++
		}
	}
	return out, positions
}

// leaseBegin is a lease that began: the version that began it.
type leaseBegin struct {
	i       int
	version uint64
	slot    int
	owner   string
	seen    int64
	create  bool  // a create of a free slot (not a takeover)
	freed   int64 // when the slot was seen free before it (a create), 0 if never held
}

func leaseStarts(evs []Event) []leaseBegin {
	var out []leaseBegin
	last := map[int]Event{}
	for i, e := range evs {
		if leaseBegins(evs, i) {
			b := leaseBegin{i: i, version: e.Version, slot: e.Slot, owner: e.Owner, seen: e.Seen, create: e.Type == "ADDED"}
			if p, ok := last[e.Slot]; ok && b.create {
				b.freed = p.Seen
			}
			out = append(out, b)
		}
		last[e.Slot] = e
	}
	return out
}

// checkLine checks the line's order and that gated pods that can be let
// in are (see above).
func (r *Report) checkLine(h History) {
	f := &r.Line
	f.Excused = map[string]int{}
	spans, positions := waiterSpans(h)
	f.Positions = positions
	for _, ws := range spans {
		for _, w := range ws {
			f.Waiters++
			if w.pod != "" {
				f.GatedWaits++
			}
			if w.pos == 0 {
				r.violate(fmt.Sprintf("line: %s recorded a spec.position other than its create's resourceVersion", w))
			}
		}
	}
	pods := map[string]PodInfo{}
	for _, p := range h.Pods {
		pods["pod:"+p.UID] = p
		if p.NotAdmitted != 0 {
			f.NotAdmitted++
		}
	}
	allowed := map[string]bool{}
	for _, rule := range lineRules {
		allowed[rule] = true
	}
	changes := leaderChanges(h.Leases)
	for _, l := range lockRecords(h) {
		begins := leaseStarts(l.evs)
		ws := spans[l.name]
		served := servedAt(ws, begins)
		for _, b := range begins {
			var line []*waiterSpan
			var own *waiterSpan
			for _, w := range ws {
				if w.pos == 0 || w.pos >= b.version || (w.goneV != 0 && w.goneV < b.version) {
					continue
				}
				if v, ok := served[w]; ok && v < b.version {
					continue // it holds already; its waiter is on its way out
				}
				if w.owner == b.owner {
					if own == nil || w.pos < own.pos {
						own = w
					}
					continue
				}
				line = append(line, w)
			}
			if len(line) == 0 {
				continue
			}
			if own != nil && plainWin(h.Ops, l.op, b) {
				// The call that won did not wait: the waiter is an earlier
				// call's of the same owner (one answered 503, its waiter
				// not yet deleted), which gives this one no place.
				own = nil
			}
			f.Leases++
			if own != nil {
				f.FromLine++
			}
			oPod, oGated := pods[b.owner]
			oGated = oGated || isGatedOwner(b.owner)
			for _, w := range line {
				if w.limit <= b.slot {
					continue // it cannot use this slot
				}
				wPod := pods[w.owner]
				bothGated := w.pod != "" && oGated
				if bothGated {
					if wPod.QueuedAt == 0 || oPod.QueuedAt == 0 {
						if own != nil && own.pos < w.pos {
							continue
						}
					} else if wPod.QueuedAt > oPod.QueuedAt || wPod.QueuedAt == oPod.QueuedAt && wPod.UID > oPod.UID {
						continue // behind it by queued-at, the gated pods' order
					}
				} else if own != nil && own.pos < w.pos {
					continue
				}
				f.Passes++
				rule := r.passRule(h, l, b, own, w, wPod, oPod, bothGated, changes)
				if rule == "" && bothGated && own != nil && behindAnother(line, own, w) {
					rule = RuleBehindAnother
				}
				if rule != "" && allowed[rule] {
					f.Excused[rule]++
					if rule == RuleGap && b.freed != 0 {
						f.LongestGap = max(f.LongestGap, b.seen-b.freed)
					}
					continue
				}
				f.Unexcused++
				who := "a plain acquire (no waiter)"
				if own != nil {
					who = own.String()
				}
				r.violate(fmt.Sprintf("line: %s slot %d went to %s at version %d (seen %s), %s, passing %s",
					l.name, b.slot, b.owner, b.version, stamp(b.seen), who, w))
			}
		}
	}
	r.checkAdmitted(h, spans, pods)
}

// behindAnother tells whether the gated pod's waiter w is placed behind a
// waiter of another kind still in line that own, the winner's, is placed
// ahead of: w waits for that waiter, own does not.
func behindAnother(line []*waiterSpan, own, w *waiterSpan) bool {
	for _, x := range line {
		if x.pod == "" && own.pos < x.pos && x.pos < w.pos {
			return true
		}
	}
	return false
}

// servedAt is, for each waiter, the version that began its owner's first
// lease after it joined.
func servedAt(ws []*waiterSpan, begins []leaseBegin) map[*waiterSpan]uint64 {
	out := map[*waiterSpan]uint64{}
	for _, w := range ws {
		for _, b := range begins {
			if b.owner == w.owner && b.version > w.pos {
				out[w] = b.version
				break
			}
		}
	}
	return out
}

// passRule names the exception that explains w's pass by b's lease, or "".
func (r *Report) passRule(h History, l gatedLock, b leaseBegin, own, w *waiterSpan, wPod, oPod PodInfo, bothGated bool, changes []int64) string {
	if w.pod != "" && wPod.Gone != 0 && wPod.Gone <= b.seen {
		return RulePodGone
	}
	if w.pod != "" && wPod.NotAdmitted != 0 && wPod.NotAdmitted <= b.seen+int64(notAdmittedSeen) {
		return RuleNotAdmitted
	}
	if bothGated {
		if oPod.QueuedAt-wPod.QueuedAt <= 2*h.Skew && wPod.QueuedAt != 0 {
			return RuleQueuedAt
		}
		for _, c := range changes {
			if c <= b.seen && b.seen <= c+int64(ManagerLeaseDuration) {
				return RuleLeaderChange
			}
		}
		return ""
	}
	if own != nil {
		return ""
	}
	if op, ok := firstAcquire(h.Ops, l.op, b.owner); ok {
		if w.created > op.Call {
			return RuleJoinedDuring
		}
		if b.create {
			return RuleGap
		}
		if op.Wait > 0 && !hadWaiter(h.Waiters, b.owner) {
			return RuleOutside
		}
		return ""
	}
	if b.create {
		return RuleGap
	}
	return ""
}

// plainWin tells whether the acquire that won b (answered with its token,
// else the owner's last acquire sent before it was seen) sent no
// waitSeconds: a plain acquire, whatever waiter its owner left behind.
func plainWin(ops []Op, lock string, b leaseBegin) bool {
	var last *Op
	for i := range ops {
		op := &ops[i]
		if op.Kind != KindAcquire || op.Lock != lock || op.Owner != b.owner || op.Role == RoleGated || op.Call > b.seen {
			continue
		}
		if op.NewToken == b.version {
			return op.Wait == 0
		}
		last = op
	}
	return last != nil && last.Wait == 0
}

// notAdmittedSeen is how long after the gate passed over a pod it cannot
// let in the pod's client may see the condition that says so.
const notAdmittedSeen = 10 * time.Second

func firstAcquire(ops []Op, lock, owner string) (Op, bool) {
	for _, op := range ops {
		if op.Kind == KindAcquire && op.Lock == lock && op.Owner == owner && op.Role != RoleGated {
			return op, true
		}
	}
	return Op{}, false
}

func hadWaiter(evs []WaiterEvent, owner string) bool {
	for _, e := range evs {
		if e.Owner == owner {
			return true
		}
	}
	return false
}

// leaderChanges are the moments the record saw the manager's Lease change
// hands.
func leaderChanges(evs []LeaseEvent) []int64 {
	var out []int64
	for i := 1; i < len(evs); i++ {
		if evs[i].Holder != evs[i-1].Holder {
			out = append(out, evs[i].Seen)
		}
	}
	return out
}

// leaderless are the spans without a leader, by the Lease's record: before
// its first version, and between two versions more than leaderStall apart
// (from the first plus a RetryPeriod, when the next renewal was due).
func leaderless(evs []LeaseEvent, end int64) [][2]int64 {
	if len(evs) == 0 {
		return [][2]int64{{0, end}}
	}
	out := [][2]int64{{0, evs[0].Seen}}
	for i := 1; i < len(evs); i++ {
		if evs[i].Seen-evs[i-1].Seen > int64(leaderStall) {
			out = append(out, [2]int64{evs[i-1].Seen + int64(ManagerRetryPeriod), evs[i].Seen})
		}
		if evs[i].Holder == "" {
			out = append(out, [2]int64{evs[i].Seen, evs[i].Seen})
		}
	}
	if last := evs[len(evs)-1].Seen + int64(leaderStall); last < end {
		out = append(out, [2]int64{last, end})
	}
	return out
}

// checkAdmitted: while a slot of a lock is free, the first waiter in line
// that could use it must not be a gated pod for longer than admitWithin of
// time in which a leader ran and the control plane was up. A pod told it
// cannot be let in (its Admitted condition False) heads nothing from then
// on: the pods behind it go on.
func (r *Report) checkAdmitted(h History, spans map[string][]*waiterSpan, pods map[string]PodInfo) {
	end := int64(0)
	for _, l := range lockRecords(h) {
		if n := len(l.evs); n > 0 {
			end = max(end, l.evs[n-1].Seen)
		}
	}
	for _, e := range h.Waiters {
		end = max(end, e.Seen)
	}
	off := append(leaderless(h.Leases, end), h.Outages...)
	for _, l := range lockRecords(h) {
		ws := spans[l.name]
		begins := leaseStarts(l.evs)
		served := map[*waiterSpan]int64{}
		for _, w := range ws {
			for _, b := range begins {
				if b.owner == w.owner && b.version > w.pos {
					served[w] = b.seen
					break
				}
			}
		}
		for slot, free := range freeSpans(h, l, end) {
			if slot >= l.limit {
				continue
			}
			for _, fs := range free {
				r.checkFreeSpan(l, slot, fs, ws, served, pods, off)
			}
		}
	}
}

// freeSpans are, per slot, the spans in which the record shows it free:
// from a lease's end (its delete or deleting version seen, or its expiry
// past the grace, on a clock up to the skew behind) to the next lease's
// first version seen, or the end of the record.
func freeSpans(h History, l gatedLock, end int64) map[int][][2]int64 {
	out := map[int][][2]int64{}
	last := map[int]*Event{}
	from := map[int]int64{}
	for i := range l.evs {
		e := &l.evs[i]
		p := last[e.Slot]
		if e.Type == "DELETED" || e.Deleting {
			if p != nil && !p.Deleting {
				from[e.Slot] = min(e.Seen, p.ExpireTime+h.Grace+h.Skew)
			}
		} else if p == nil || p.Type == "DELETED" || p.Deleting || p.Owner != e.Owner || p.AcquireTime != e.AcquireTime {
			// A lease begins: the slot was free since the last one ended
			// (or expired, for a takeover).
			f, ok := from[e.Slot]
			if p != nil && !p.Deleting && p.Type != "DELETED" {
				f, ok = p.ExpireTime+h.Grace+h.Skew, true
			}
			if ok && f < e.Seen {
				out[e.Slot] = append(out[e.Slot], [2]int64{f, e.Seen})
			}
			delete(from, e.Slot)
		}
		last[e.Slot] = e
	}
	for slot, f := range from {
		if f < end {
			out[slot] = append(out[slot], [2]int64{f, end})
		}
	}
	for slot := range l.limit {
		if last[slot] == nil {
			out[slot] = append(out[slot], [2]int64{0, end}) // never held
		}
	}
	return out
}

// checkFreeSpan follows who heads slot's line through one free span.
func (r *Report) checkFreeSpan(l gatedLock, slot int, fs [2]int64, ws []*waiterSpan, served map[*waiterSpan]int64, pods map[string]PodInfo, off [][2]int64) {
	// The moments the head can change: waiters joining, leaving, served;
	// pods told, or gone.
	points := []int64{fs[0], fs[1]}
	for _, w := range ws {
		for _, t := range []int64{w.created, w.gone, served[w], pods[w.owner].NotAdmitted, pods[w.owner].Gone} {
			if t > fs[0] && t < fs[1] {
				points = append(points, t)
			}
		}
	}
	sort.Slice(points, func(i, j int) bool { return points[i] < points[j] })
	var head *waiterSpan
	var counted int64
	for k := 0; k+1 < len(points); k++ {
		t0, t1 := points[k], points[k+1]
		if t1 <= t0 {
			continue
		}
		var h *waiterSpan
		for _, w := range ws {
			if w.pos == 0 || w.limit <= slot || w.created > t0 || (w.gone != 0 && w.gone <= t0) {
				continue
			}
			if s, ok := served[w]; ok && s <= t0 {
				continue
			}
			if p := pods[w.owner]; w.pod != "" && (p.NotAdmitted != 0 && p.NotAdmitted <= t0 || p.Gone != 0 && p.Gone <= t0) {
				continue
			}
			if h == nil || w.pos < h.pos {
				h = w
			}
		}
		if h != head {
			head, counted = h, 0
		}
		if head == nil || head.pod == "" {
			continue
		}
		counted += t1 - t0 - overlapUnion(t0, t1, off)
		r.Line.LongestHead = max(r.Line.LongestHead, counted)
		if counted > int64(admitWithin) {
			r.violate(fmt.Sprintf("gated: %s slot %d stayed free from %s to %s while %s (%s) headed the line of those who could use it, %s of it with a leader and the control plane up (the bound is %s)",
				l.name, slot, stamp(fs[0]), stamp(fs[1]), head, gatedPodName(pods[head.owner]), time.Duration(counted).Round(time.Millisecond), admitWithin))
			return
		}
	}
}

func gatedPodName(p PodInfo) string {
	if p.Name == "" {
		return "pod unknown to its client"
	}
	s := "pod " + p.Name
	if p.Shape != "" {
		s += ", shape " + p.Shape
	}
	return s
}

// overlapUnion is how much of [from, to] the union of spans covers.
func overlapUnion(from, to int64, spans [][2]int64) int64 {
	var in [][2]int64
	for _, s := range spans {
		if lo, hi := max(from, s[0]), min(to, s[1]); hi > lo {
			in = append(in, [2]int64{lo, hi})
		}
	}
	sort.Slice(in, func(i, j int) bool { return in[i][0] < in[j][0] })
	var sum, reach int64
	reach = from
	for _, s := range in {
		lo := max(s[0], reach)
		if s[1] > lo {
			sum += s[1] - lo
			reach = s[1]
		}
	}
	return sum
}

// printLine writes checkLine's figures as rows of the report.
func printLine(w func(string, int), dur func(string, int64), f LineFigures) {
	w("waiters recorded (QueenLockWaiter creates)", f.Waiters)
	w("  of them gated pods'", f.GatedWaits)
	w("  positions recorded by their carriers", f.Positions)
	w("leases begun while waiters stood in the line (order checks)", f.Leases)
	w("  of them taken by a waiter in the line", f.FromLine)
	w("waiters passed", f.Passes)
	for _, k := range slices.Sorted(maps.Keys(f.Excused)) {
		w("  excused: "+k, f.Excused[k])
	}
	w("  not excused (violations)", f.Unexcused)
	dur("longest a slot stayed free before a plain create passed the line", f.LongestGap)
	dur("longest a gated pod headed a free slot's line (leader up, no outage)", f.LongestHead)
	w("gated pods told they cannot be let in", f.NotAdmitted)
}
