package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Report is what the checks found.
type Report struct {
	Ops       map[string]int // "kind/outcome" -> count
	Permits   int            // permit versions recorded
	Objects   int            // ConfigMap versions recorded
	Handovers map[string]int // release, expiry, takeover
	Renewals  int
	Accepted  int // guarded writes stored
	Raises    int // versions of the guarded object that only raised its record (an acquire's fence)
	Window    int // stored writes whose permit changed between the guard's check and the commit, stored before the next acquire was answered
	// LateCreates counts creates of a replaced holder stored after the
	// next acquire was answered, within the bound docs/fencing.md states.
	LateCreates int
	Deletes     int // deletes of the guarded object admitted (each under a current mark)
	// Misbehaving: "role kind/outcome" -> count of the misbehaving clients'
	// operations on the guarded object.
	Misbehaving map[string]int
	// LongestWait is the longest time, in ns, from a lease's release or
	// expiry to the next acquire, among the gaps in which a client was
	// refused (held or contended).
	LongestWait int64
	// MostHolders is the most holders of the semaphore at once, by the
	// answers; SemVersions its permit versions recorded.
	MostHolders int
	// Denied counts calls the route refused with 401 or 403 though the
	// clients' token and rights were good all along.
	Denied int
	// Excused counts acquires refused past the bound of checkAvailable only
	// because the control plane was down meanwhile (History.Outages);
	// LongestExcused is the longest such wait, in ns.
	Excused        int
	LongestExcused int64
	// LeftToLine counts acquires answered held while waiters stood in the
	// lock's line: the lock went to the line, not to them, so they are no
	// refusal of a free lock.
	LeftToLine int
	// Waiting counts acquires sent with waitSeconds, WaitWon those of them
	// answered acquired after the call had waited (not at its first try:
	// more than 100 ms after the call).
	Waiting, WaitWon int
	SemVersions      int
	Resolved         int // lost answers settled from the record (linearizability)
	Dropped          int // lost answers that left no trace: not applied
	Open             int // lost answers left open (a release, or an expiry)
	Linearized       string
	Violations       []string
	Gated            GatedFigures
	Leaders          LeaderFigures
	// Line is what checkLine found of the line's order and the gated
	// pods' admissions.
	Line LineFigures
	// GaveBack counts acquires the route may have given back because
	// their caller went away (givenBack); GiveBack has the rest.
	GaveBack int
	GiveBack GiveBackFigures
}

// Check runs every check over h. timeout bounds the linearizability search.
func Check(h History, timeout time.Duration) Report {
	r := Report{Ops: map[string]int{}, Handovers: map[string]int{}, Misbehaving: map[string]int{}, Permits: len(h.Permits), Objects: len(h.Objects)}
	b := boundsOf(h)
	if revokes := podRevokes(h); len(revokes) > 0 {
		h.Ops = append(append([]Op(nil), h.Ops...), revokes...)
		sortOps(h.Ops)
	}
	for _, op := range h.Ops {
		if op.Lock != "" && (op.Kind != KindWrite || op.Role == RoleLeader) {
			r.Ops[op.Lock+": "+op.Kind+"/"+op.Outcome]++
		} else {
			r.Ops[op.Kind+"/"+op.Outcome]++
		}
		if op.Role != "" && op.Role != RoleHolder && op.Role != RolePodGone && op.Role != RoleGated && op.Role != RoleLeader {
			r.Misbehaving[op.Role+" "+op.Kind+"/"+op.Outcome]++
		}
		if op.BadCall && (strings.Contains(op.Error, "route answered 401") || strings.Contains(op.Error, "route answered 403")) {
			op.BadCall, op.Denied = false, true // recorded before 401 and 403 were told apart
		}
		if op.Denied {
			r.Denied++
		}
		if op.Kind == KindAcquire && op.Wait > 0 {
			r.Waiting++
			if op.Outcome == Acquired && op.Return-op.Call > int64(100*time.Millisecond) {
				r.WaitWon++
			}
		}
		if op.BadCall {
			r.violate(fmt.Sprintf("harness: the route refused a call as malformed: %s", op))
		}
	}
	// Gated pods hold the lock and the semaphore too: the manager's
	// acquires and ends for them, from the record, join the operations,
	// and so do the route's give-backs of acquires whose caller went away
	// (after the counts above, which are the clients' own).
	r.settleHangUps(&h)
	back := givenBack(h)
	if more := append(gatedOps(h), back...); len(more) > 0 {
		h.Ops = append(append([]Op(nil), h.Ops...), more...)
		sortOps(h.Ops)
		for _, op := range more {
			if op.Role == RoleGaveBack {
				r.GaveBack++
			}
		}
	}
	r.checkOrder(h)
	r.checkFences(h, b)
	r.checkDeletes(h, b)
	r.checkHandovers(h)
	r.checkAvailable(h, b)
	r.checkAcknowledged(h)
	r.checkSemaphore(h, b)
	r.checkGated(h, b)
	r.checkLeaders(h, b)
	r.checkLine(h)
	r.checkGiveBacks(h, back)
	ops, resolved, dropped := resolve(h.Ops, h.Permits)
	r.Resolved, r.Dropped = resolved, dropped
	for _, op := range ops {
		if op.Outcome == Unknown {
			r.Open++
		}
	}
	switch res, _ := checkLinearizable(ops, b, timeout); res {
	case porcupine.Ok:
		r.Linearized = "yes"
	case porcupine.Illegal:
		r.Linearized = "no"
		r.violate("linearizability: the acquire/renew/release history fits no order of a single lease")
	default:
		r.Linearized = "unknown (timed out)"
		r.violate(fmt.Sprintf("linearizability: porcupine did not finish in %s", timeout))
	}
	return r
}

func (r *Report) violate(msg string) { r.Violations = append(r.Violations, msg) }

// overlap is how much of [from, to] the spans cover.
func overlap(from, to int64, spans [][2]int64) int64 {
	var sum int64
	for _, s := range spans {
		if lo, hi := max(from, s[0]), min(to, s[1]); hi > lo {
			sum += hi - lo
		}
	}
	return sum
}

func sortOps(ops []Op) {
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
}

// podRevokes are the deletes of the lock's permit that a holder pod's
// delete allowed: a permit naming that pod, deleted after the pod's delete
// was sent. Each becomes a revoke of that version, sent with the pod's
// delete and answered by the time the watch saw the permit go. Its outcome
// is unknown, because the holder's own release may have won the race to
// delete that version: the model may apply it or not.
func podRevokes(h History) []Op {
	gone := map[string]PodGone{}
	for _, p := range h.PodsGone {
		gone[p.UID] = p
	}
	var out []Op
	for i, e := range h.Permits {
		if i == 0 || e.Type != "DELETED" || e.HolderPod == "" {
			continue
		}
		last := h.Permits[i-1]
		p, ok := gone[e.HolderPod]
		if !ok || p.Call >= e.Seen || last.Type == "DELETED" || last.Deleting {
			continue
		}
		out = append(out, Op{Client: -1 - p.Client, Role: RolePodGone, Kind: KindRevoke, Owner: last.Owner, Token: last.Version,
			Call: p.Call, Return: e.Seen, Until: e.Seen, Outcome: Unknown})
	}
	return out
}

// checkOrder: each watch delivers versions in commit order, so they only
// go up; anything else means the recorded history itself is unsound.
func (r *Report) checkOrder(h History) {
	for name, evs := range map[string][]Event{"permit": h.Permits, "object": h.Objects} {
		for i := 1; i < len(evs); i++ {
			if evs[i].Version <= evs[i-1].Version {
				r.violate(fmt.Sprintf("recording: %s version %d came after %d", name, evs[i].Version, evs[i-1].Version))
			}
		}
	}
}

// checkFences: every version of the ConfigMap was stored by a guarded
// write of the run's lock (slot 0) sent by a holder, with the record set
// from that write's own guard; the tokens it accepted never go down; and
// each was the permit's current token, on a lease that had not ended, when
// its write was admitted.
//
// A write sent after its token's lease ended (by the server's stamp,
// allowing for the skew of the replica that judged it) was admitted after
// it too: the guard must have refused it.
//
// Admission happens between the write's call and its commit. When the
// permit's next version (after the writer's token) committed after the
// write, the token was current when the write committed, hence when it was
// admitted. When it committed before the write, the guard's read and the
// commit straddled it: allowed (docs/fencing.md, the window that remains)
// only if that next version was not yet visible when the write was sent;
// the watcher's receipt time bounds its commit from above, so a next
// version received before the call proves the write was admitted under a
// replaced token.
// fenceKey names a guarded write: its token, the counter it wrote, and
// whether it created the object.
type fenceKey struct {
	token, counter uint64
	create         bool
}

func (r *Report) checkFences(h History, b bounds) {
	sent := map[fenceKey][]Op{} // write attempts by a holder of the run's lock
	for _, op := range h.Ops {
		if op.Kind == KindWrite && op.Outcome != Failed && op.Outcome != Refused && op.Lock == "" && op.Guard != "" {
			k := fenceKey{op.Token, uint64(op.Counter), op.Create}
			sent[k] = append(sent[k], op)
		}
	}
	want := fmt.Sprintf("%s#0", Lock)
	succ := newSuccession(h)
	var highest, raised uint64
	var prev *Event
	for _, w := range h.Objects {
		if w.Type == "DELETED" {
			prev, raised = nil, 0 // the record went with the object
			continue
		}
		// An acquire raises the record of the objects bound to its slot
		// before it answers (docs/fencing.md): the manager's write changes
		// the record alone, never the data a holder wrote, and only ever
		// raises it. Such a version is no holder's write.
		// The setup's own write (counter 0) comes before the history does,
		// so a raise of it has no recorded version before it.
		setupRaised := prev == nil && w.Writer == "setup" && w.Counter == 0
		if p := prev; w.Type == "MODIFIED" && w.Fence > w.Token && w.FenceLock == want &&
			(setupRaised || p != nil && w.Token == p.Token && w.Counter == p.Counter && w.FenceLock == p.FenceLock && w.Fence > p.Fence) {
			r.Raises++
			raised = max(raised, w.Fence)
			prev = &w
			continue
		}
		prev = &w
		r.Accepted++
		r.checkFence(h, b, succ, w, want, &highest, raised, sent)
	}
}

// checkFence checks one stored version w of the ConfigMap that is a
// holder's write (not a raise). highest is the highest token stored so
// far, raised the highest record an acquire raised.
func (r *Report) checkFence(h History, b bounds, succ *succession, w Event, want string, highest *uint64, raised uint64, sent map[fenceKey][]Op) {
	if w.Fence == 0 || w.FenceLock != want {
		r.violate(fmt.Sprintf("fence: version %d of the ConfigMap (writer %q, token %d) was stored with the record %q=%d, not one of lock %s: a write without a guard, or under another lock's, was accepted",
			w.Version, w.Writer, w.Token, w.FenceLock, w.Fence, want))
		return
	}
	// A replaced holder's create within the bound docs/fencing.md states
	// may store a token below one stored before (the next holder wrote,
	// deleted, and the held create landed on the free name): it is told
	// below, and only then excused.
	bounded := false
	if down := w.Token < *highest; down {
		defer func() {
			if !bounded {
				r.violate(fmt.Sprintf("fence: the ConfigMap accepted token %d at version %d after token %d", w.Token, w.Version, *highest))
			}
		}()
	}
	if w.Token < raised && w.Type != "ADDED" {
		r.violate(fmt.Sprintf("fence: the ConfigMap accepted token %d at version %d after an acquire raised its record to %d", w.Token, w.Version, raised))
	}
	*highest = max(*highest, w.Token)
	if w.Fence != w.Token {
		r.violate(fmt.Sprintf("fence: version %d was written under token %d but records fence %d", w.Version, w.Token, w.Fence))
	}
	i := sort.Search(len(h.Permits), func(i int) bool { return h.Permits[i].Version >= w.Token })
	if i == len(h.Permits) || h.Permits[i].Version != w.Token || h.Permits[i].Type == "DELETED" || h.Permits[i].Deleting {
		r.violate(fmt.Sprintf("fence: version %d of the ConfigMap was accepted under token %d, which is no held version of the permit", w.Version, w.Token))
		return
	}
	attempts := sent[fenceKey{w.Token, uint64(w.Counter), w.Type == "ADDED"}]
	if len(attempts) == 0 {
		r.violate(fmt.Sprintf("fence: version %d (%s, token %d, counter %d) matches no guarded write a client sent", w.Version, w.Type, w.Token, w.Counter))
		return
	}
	call := attempts[0].Call
	for _, a := range attempts {
		call = min(call, a.Call)
	}
	if end := h.Permits[i].ExpireTime; call-b.skew >= end {
		r.violate(fmt.Sprintf("fence: the write of counter %d under token %d was sent at %s, after that lease ended at %s, and was still accepted",
			w.Counter, w.Token, stamp(call), stamp(end)))
		return
	}
	if i+1 == len(h.Permits) || h.Permits[i+1].Version > w.Version {
		return // still current at commit
	}
	next := h.Permits[i+1]
	if next.Seen < call {
		r.violate(fmt.Sprintf("fence: the write of counter %d under token %d was sent at %s, after the permit had moved on to version %d (%s, seen %s), and was still accepted",
			w.Counter, w.Token, stamp(call), next.Version, next.Type, stamp(next.Seen)))
		return
	}
	var reported bool
	bounded, reported = r.checkLate(succ, h.Permits, i, w, call, fmt.Sprintf("the write of counter %d", w.Counter))
	if !bounded && !reported {
		r.Window++ // checked while current, stored before the next acquire was answered
	}
}

func (r *Report) checkDeletes(h History, b bounds) {
	succ := newSuccession(h)
	var sent []Op
	for _, op := range h.Ops {
		if op.Kind == KindDelete && op.Outcome != Failed && op.Outcome != Refused {
			sent = append(sent, op)
		}
	}
	for _, d := range h.Objects {
		if d.Type != "DELETED" {
			continue
		}
		r.Deletes++
		if d.Fence == 0 || d.Deletable != strconv.FormatUint(d.Fence, 10) {
			r.violate(fmt.Sprintf("delete: the ConfigMap was deleted (version %d) though its last write (record %s=%d, mark %q) had not marked it deletable under its token",
				d.Version, d.FenceLock, d.Fence, d.Deletable))
			continue
		}
		i := sort.Search(len(h.Permits), func(i int) bool { return h.Permits[i].Version >= d.Fence })
		if i == len(h.Permits) || h.Permits[i].Version != d.Fence {
			r.violate(fmt.Sprintf("delete: the ConfigMap was deleted (version %d) under token %d, which is no version of the permit", d.Version, d.Fence))
			continue
		}
		// The latest delete sent before the watcher saw this one.
		var call int64
		for _, op := range sent {
			if op.Call < d.Seen {
				call = max(call, op.Call)
			}
		}
		if call == 0 {
			r.violate(fmt.Sprintf("delete: the ConfigMap was deleted (version %d), but no client sent a delete before it was seen", d.Version))
			continue
		}
		p := h.Permits[i]
		if i+1 < len(h.Permits) && h.Permits[i+1].Version < d.Version {
			if next := h.Permits[i+1]; next.Seen < call {
				r.violate(fmt.Sprintf("delete: the ConfigMap was deleted (version %d) under token %d by a delete sent at %s, after the permit had moved on to version %d (seen %s)",
					d.Version, d.Fence, stamp(call), next.Version, stamp(next.Seen)))
				continue
			}
		}
		if call-b.skew >= p.ExpireTime {
			r.violate(fmt.Sprintf("delete: the ConfigMap was deleted (version %d) under token %d by a delete sent at %s, after that lease ended at %s",
				d.Version, d.Fence, stamp(call), stamp(p.ExpireTime)))
			continue
		}
		r.checkLate(succ, h.Permits, i, d, call, "the delete of the ConfigMap")
	}
}

// checkHandovers: by the server-stamped times, no holder took the permit
// before the previous lease could have ended, unless the previous holder
// released it; and no renew landed after its lease had ended.
func (r *Report) checkHandovers(h History) {
	released := map[string][]int64{} // owner -> calls of releases and revokes of its permit
	podGone := map[string][]int64{}  // owner -> calls of the deletes of its pod
	gatedEnd := map[string][]int64{} // owner (a gated pod) -> the ends of its permit (gatedOps)
	for _, op := range h.Ops {
		if (op.Kind == KindRelease || op.Kind == KindRevoke) && op.Outcome != Failed && op.Lock == "" {
			released[op.Owner] = append(released[op.Owner], op.Call)
			if op.Role == RolePodGone {
				podGone[op.Owner] = append(podGone[op.Owner], op.Call)
			}
			if op.Role == RoleGated {
				gatedEnd[op.Owner] = append(gatedEnd[op.Owner], op.Call)
			}
		}
	}
	// When the write of each acknowledged version was sent: its lease
	// began no earlier, by the machine's clock.
	sent := map[uint64]int64{}
	for _, op := range h.Ops {
		if op.Lock == "" && (op.Outcome == Acquired || op.Outcome == Renewed) {
			sent[op.NewToken] = op.Call
		}
	}
	// realTime: by the machine's clock, which the stamps of skewed replicas
	// do not show, the lease of version last began no earlier than its
	// write was sent and lasted its TTL; the acquire e was admitted before
	// the watcher saw it. A grace of at least twice the skew keeps the two
	// in order; a takeover or expiry judged by a clock further off does not.
	realTime := func(e, last *Event) {
		call, ok := sent[last.Version]
		if !ok {
			return
		}
		if end := call + (last.ExpireTime - last.RenewTime); e.Seen < end {
			r.violate(fmt.Sprintf("handover in real time: %s's acquire (version %d) was seen at %s, before %s's lease of version %d could end (its write was sent at %s, plus its TTL: %s)",
				e.Owner, e.Version, stamp(e.Seen), last.Owner, last.Version, stamp(call), stamp(end)))
		}
	}
	var prev *Event    // the live version, nil when the permit does not exist
	var deleted *Event // the last state before a delete
	var lastLive *Event
	for i := range h.Permits {
		e := &h.Permits[i]
		if i > 0 && h.Permits[i-1].Type != "DELETED" && !h.Permits[i-1].Deleting {
			lastLive = &h.Permits[i-1]
		}
		switch e.Type {
		case "DELETED":
			deleted, prev = e, nil
		case "ADDED":
			if deleted != nil {
				byRelease, byPod, byGated := false, false, false
				for _, call := range released[deleted.Owner] {
					byRelease = byRelease || call < deleted.Seen
				}
				for _, call := range podGone[deleted.Owner] {
					byPod = byPod || call < deleted.Seen
				}
				for _, call := range gatedEnd[deleted.Owner] {
					byGated = byGated || call < deleted.Seen
				}
				switch {
				case byPod:
					r.Handovers["pod-gone"]++
				case byGated:
					r.Handovers["gated pod ended"]++
				case byRelease:
					r.Handovers["release"]++
				default:
					r.Handovers["expiry"]++
					if lastLive != nil {
						realTime(e, lastLive)
					}
					if e.AcquireTime < deleted.ExpireTime {
						r.violate(fmt.Sprintf("handover: %s acquired at %s (version %d) though %s's lease ran to %s and was not released",
							e.Owner, stamp(e.AcquireTime), e.Version, deleted.Owner, stamp(deleted.ExpireTime)))
					}
				}
			}
			prev, deleted = e, nil
		case "MODIFIED":
			if prev == nil {
				r.violate(fmt.Sprintf("recording: version %d modified a permit that did not exist", e.Version))
				prev = e
				continue
			}
			if e.Deleting || prev.Deleting {
				// A foreground or orphan delete in progress: its finalizers
				// go, nothing else may change.
				if e.Owner != prev.Owner || e.AcquireTime != prev.AcquireTime || e.ExpireTime != prev.ExpireTime {
					r.violate(fmt.Sprintf("handover: version %d changed a permit being deleted: %s after %s", e.Version, e, prev))
				}
				if !prev.Deleting {
					r.Handovers["deleting"]++
				}
				prev = e
				continue
			}
			if e.AcquireTime != prev.AcquireTime {
				r.Handovers["takeover"]++
				realTime(e, prev)
				if e.AcquireTime < prev.ExpireTime {
					r.violate(fmt.Sprintf("handover: %s took over at %s (version %d) though %s's lease ran to %s",
						e.Owner, stamp(e.AcquireTime), e.Version, prev.Owner, stamp(prev.ExpireTime)))
				}
			} else {
				r.Renewals++
				if e.Owner != prev.Owner {
					r.violate(fmt.Sprintf("handover: version %d changed the owner from %s to %s without a new acquireTime", e.Version, prev.Owner, e.Owner))
				}
				if e.RenewTime >= prev.ExpireTime {
					r.violate(fmt.Sprintf("renew: %s renewed at %s (version %d), after its lease ended at %s",
						e.Owner, stamp(e.RenewTime), e.Version, stamp(prev.ExpireTime)))
				}
			}
			prev = e
		}
	}
}

// checkAcknowledged: whatever a client was told happened is in the
// recorded history.
func (r *Report) checkAcknowledged(h History) {
	versions := map[uint64]Event{}
	deletedOwners := map[string]bool{}
	deletedAfter := map[uint64]int64{} // version -> when its delete (or deletion start) was seen
	for i, e := range h.Permits {
		versions[e.Version] = e
		if e.Type == "DELETED" {
			deletedOwners[e.Owner] = true
		}
		if i > 0 && (e.Type == "DELETED" || e.Deleting) && !h.Permits[i-1].Deleting {
			deletedAfter[h.Permits[i-1].Version] = e.Seen
		}
	}
	objects := map[uint64]Event{}
	var objectDeletes []int64
	for _, e := range h.Objects {
		objects[e.Version] = e
		if e.Type == "DELETED" {
			objectDeletes = append(objectDeletes, e.Seen)
		}
	}
	for _, op := range h.Ops {
		if op.Lock != "" {
			continue // another lock: not recorded
		}
		switch op.Kind + "/" + op.Outcome {
		case KindRevoke + "/" + Released:
			if _, ok := deletedAfter[op.Token]; !ok {
				r.violate(fmt.Sprintf("acknowledged: %s, but no delete of version %d was recorded", op, op.Token))
			}
		case KindDelete + "/" + Deleted:
			found := false
			for _, seen := range objectDeletes {
				found = found || seen > op.Call
			}
			if !found {
				r.violate(fmt.Sprintf("acknowledged: %s, but no delete of the ConfigMap was recorded after it", op))
			}
		case KindAcquire + "/" + Acquired, KindRenew + "/" + Renewed:
			e, ok := versions[op.NewToken]
			if !ok || e.Type == "DELETED" || e.Owner != op.Owner || e.ExpireTime != op.ExpiresAt {
				r.violate(fmt.Sprintf("acknowledged: %s answered token %d, but the permit has no such version for that owner and expiry", op, op.NewToken))
			}
		case KindRelease + "/" + Released:
			if !deletedOwners[op.Owner] {
				r.violate(fmt.Sprintf("acknowledged: %s, but no delete of %s's permit was recorded", op, op.Owner))
			}
		case KindWrite + "/" + Written:
			e, ok := objects[op.Version]
			if !ok || e.Counter != op.Counter || e.Token != op.Token {
				r.violate(fmt.Sprintf("acknowledged: %s, but the ConfigMap has no such version", op))
			}
		}
	}
}

// checkAvailable: the lock never stays unacquirable for longer than a TTL
// and the grace after a lease ends, while clients ask for it. A lease ends
// when it is released or revoked (its delete starts) or when it expires;
// from then on an acquire should win within the grace (a takeover, or the
// expiry controller's delete) plus the time a delete in progress takes to
// finish. An acquire answered held or contended, sent later than the end
// plus the lease's TTL plus the grace and before anyone acquired the lock,
// is a lock stuck unacquirable: a permit that lingers after its delete, or
// an expired one nobody may take over. Calls that failed (the manager or
// API server down) say nothing and are left out; the replicas' skew is
// allowed on top.
func (r *Report) checkAvailable(h History, b bounds) {
	type gap struct {
		from, to, ttl int64
		owner         string
		version       uint64 // the lease's last version
	}
	var gaps []gap
	var live *Event // the lease in force, nil when the permit is gone or being deleted
	var last *Event // the last version of the last lease
	end := int64(0)
	for i := range h.Permits {
		e := &h.Permits[i]
		acquire := e.Type == "ADDED" || (e.Type == "MODIFIED" && !e.Deleting && last != nil && e.AcquireTime != last.AcquireTime)
		switch {
		case acquire:
			if last != nil {
				from := last.ExpireTime
				if end != 0 {
					from = min(from, end)
				}
				// The acquire was admitted no later than the watcher saw
				// it, and no earlier than its stamp allows.
				gaps = append(gaps, gap{from: from, to: min(e.Seen, e.AcquireTime-b.skew), ttl: last.ExpireTime - last.RenewTime, owner: last.Owner, version: last.Version})
			}
			live, last, end = e, e, 0
		case e.Type == "DELETED" || e.Deleting:
			if live != nil {
				end = e.Seen
			}
			live = nil
		default:
			live, last = e, e
		}
	}
	if last != nil {
		from := last.ExpireTime
		if end != 0 {
			from = min(from, end)
		}
		gaps = append(gaps, gap{from: from, to: 1<<63 - 1, ttl: last.ExpireTime - last.RenewTime, owner: last.Owner, version: last.Version})
	}
	var refused []Op
	for _, op := range h.Ops {
		if op.Kind == KindAcquire && op.Lock == "" && (op.Outcome == Held || op.Outcome == Contended) {
			if op.Waiting > 0 {
				r.LeftToLine++
				continue
			}
			if op.Wait > 0 {
				// A waiting acquire tries last when its wait is over: had
				// the lock been free then (or had a free slot not woken
				// it), it would have won.
				op.Call = op.Return
			}
			refused = append(refused, op)
		}
	}
	sort.Slice(refused, func(i, j int) bool { return refused[i].Call < refused[j].Call })
	for _, g := range gaps {
		i := sort.Search(len(refused), func(i int) bool { return refused[i].Call >= g.from })
		if i == len(refused) || refused[i].Call >= g.to {
			continue // nobody was refused in this gap
		}
		if g.to != 1<<63-1 {
			r.LongestWait = max(r.LongestWait, g.to-g.from)
		}
		budget := g.ttl + b.grace + b.skew
		for j := sort.Search(len(refused), func(j int) bool { return refused[j].Call >= g.from+budget }); j < len(refused) && refused[j].Call < g.to; j++ {
			if refused[j].Outcome == Held && refused[j].HolderToken > g.version {
				continue // it names a newer holder: the lock was taken
			}
			waited := refused[j].Call - g.from
			if waited-overlap(g.from, refused[j].Call, h.Outages) <= budget {
				r.Excused++
				r.LongestExcused = max(r.LongestExcused, waited)
				continue
			}
			r.violate(fmt.Sprintf("available: %s's lease ended at %s, yet %s (more than the TTL %s and the grace %s later, not counting outages), before anyone acquired the lock",
				g.owner, stamp(g.from), refused[j], time.Duration(g.ttl), time.Duration(b.grace)))
			break
		}
	}
}

// checkSemaphore: the semaphore never has more than SemaphoreLimit live
// holders, by the answers; its permits are its slots only, and each slot's
// record is a history of single leases (the same handover checks as the
// lock's); an owner is never answered two slots.
//
// A lease, by the answers, runs from its acquire's stamp (expiresAt minus
// the TTL) to its last renew's expiresAt, or to its release's call (less the
// skew: the next holder's stamp may be that far behind). A takeover is
// stamped at least the grace after the end it follows, and a permit the
// controller deleted is created again at least the grace less twice the
// skew after it; so with a grace of at least twice the skew, leases that
// follow each other do not overlap, and more than the limit at once is a
// fourth holder.
func (r *Report) checkSemaphore(h History, b bounds) {
	r.SemVersions = len(h.SemPermits)
	var beyond []Event
	for _, e := range h.SemPermits {
		if e.Slot >= SemaphoreLimit || e.Slot < 0 {
			beyond = append(beyond, e)
		}
	}
	if len(beyond) > 0 {
		e := beyond[0]
		r.violate(fmt.Sprintf("semaphore: permit version %d of %s (owner %s) is slot %d, beyond its limit %d (%d such versions recorded)",
			e.Version, Semaphore, e.Owner, e.Slot, SemaphoreLimit, len(beyond)))
	}
	var ops []Op
	for _, op := range h.Ops {
		if op.Lock == Semaphore {
			ops = append(ops, op)
		}
	}
	// Each slot's record, with the operations on it, is a single lease's.
	for slot := 0; slot < SemaphoreLimit; slot++ {
		sub := History{Grace: h.Grace, Skew: h.Skew}
		for _, e := range h.SemPermits {
			if e.Slot == slot {
				sub.Permits = append(sub.Permits, e)
			}
		}
		for _, op := range ops {
			if op.Slot == slot && (op.Outcome == Acquired || op.Kind != KindAcquire) {
				op.Lock = ""
				sub.Ops = append(sub.Ops, op)
			}
		}
		var sr Report
		sr.Handovers = map[string]int{}
		sr.checkHandovers(sub)
		for _, v := range sr.Violations {
			r.violate(fmt.Sprintf("semaphore slot %d: %s", slot, v))
		}
	}
	// By the answers: one slot per owner, and at most the limit at once.
	type lease struct {
		slot       int
		start, end int64
	}
	leases := map[string]*lease{}
	for _, op := range ops {
		if op.Role == RoleGated {
			continue // a gated pod holds by its Hold (checkGated), not by a permit's answers
		}
		switch op.Outcome {
		case Acquired, Already, Renewed:
			l := leases[op.Owner]
			if l == nil {
				l = &lease{slot: op.Slot, start: op.ExpiresAt - op.TTL*int64(time.Second), end: op.ExpiresAt}
				leases[op.Owner] = l
			} else if l.slot != op.Slot {
				r.violate(fmt.Sprintf("semaphore: owner %s was answered slot %d and slot %d: %s", op.Owner, l.slot, op.Slot, op))
			}
			l.end = max(l.end, op.ExpiresAt)
		}
	}
	for _, op := range ops {
		if op.Kind == KindRelease && op.Outcome == Released {
			if l := leases[op.Owner]; l != nil {
				l.end = min(l.end, op.Call-b.skew)
			}
		}
		// A release answered lost deletes the lease all the same once the
		// answering replica's clock, up to the skew ahead, has passed its
		// end (see the lease model): no earlier than its call, nor than
		// the end less the skew; the next holder's stamp is up to the skew
		// behind that.
		if op.Kind == KindRelease && op.Outcome == Lost {
			if l := leases[op.Owner]; l != nil {
				l.end = min(l.end, max(op.Call, l.end-b.skew)-b.skew)
			}
		}
	}
	// A lease ends no later than the watch saw its permit deleted (a
	// release whose answer was lost, or an expiry): the slot checks above
	// judge whether that delete was in order. Like a release's call, the
	// sighting is on this harness's clock while the next lease's start is
	// stamped by a replica up to the skew behind it, so it counts the skew
	// earlier: a permit created right after the delete (a later version)
	// can carry an acquireTime before the delete was seen.
	for _, e := range h.SemPermits {
		if e.Type == "DELETED" || e.Deleting {
			if l := leases[e.Owner]; l != nil && l.slot == e.Slot {
				l.end = min(l.end, e.Seen-b.skew)
			}
		}
	}
	type edge struct {
		at    int64
		delta int
		owner string
	}
	var edges []edge
	for owner, l := range leases {
		if l.end > l.start {
			edges = append(edges, edge{l.start, 1, owner}, edge{l.end, -1, owner})
		}
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at != edges[j].at {
			return edges[i].at < edges[j].at
		}
		return edges[i].delta < edges[j].delta // an end before a start at the same instant
	})
	live := map[string]bool{}
	reported := false
	for _, e := range edges {
		if e.delta > 0 {
			live[e.owner] = true
		} else {
			delete(live, e.owner)
		}
		r.MostHolders = max(r.MostHolders, len(live))
		if len(live) > SemaphoreLimit && !reported {
			reported = true
			var owners []string
			for o := range live {
				owners = append(owners, fmt.Sprintf("%s (slot %d, %s..%s)", o, leases[o].slot, stamp(leases[o].start), stamp(leases[o].end)))
			}
			sort.Strings(owners)
			r.violate(fmt.Sprintf("semaphore: %d holders of %s (limit %d) at %s, by the answers: %v", len(live), Semaphore, SemaphoreLimit, stamp(e.at), owners))
		}
	}
}
