package main

import (
	"fmt"
	"sort"
)

// LeaderFigures are the fenced leaders' counts.
type LeaderFigures struct {
	Terms   int // acquires answered (a create or takeover won)
	Renews  int // renews answered
	Writes  int // leaders' writes stored
	Raises  int // versions that only raised the record (an acquire's fence)
	Refused int // leaders' writes refused (by the webhook, or locally once lost)
	Window  int // stored after the permit moved on, before the next acquire was answered
}

// checkLeaders checks the fenced leaders' ConfigMap as checkFences checks
// the lock's: every stored write carries the record of LeaderLock slot 0
// under a token that was a held version of the leaders' permit, tokens
// never go down, no write was sent after its lease ended or after the
// permit moved on, and none of a replaced leader was stored after the next
// leader's acquire was answered (a create within the bound excepted).
func (r *Report) checkLeaders(h History, b bounds) {
	f := &r.Leaders
	want := LeaderLock + "#0"
	type key struct {
		owner   string
		counter int64
	}
	var ops []Op
	sent := map[key][]Op{}
	for _, op := range h.Ops {
		if op.Role != RoleLeader {
			continue
		}
		switch {
		case op.Kind == KindAcquire && op.Outcome == Acquired:
			f.Terms++
		case op.Kind == KindRenew && op.Outcome == Renewed:
			f.Renews++
		case op.Kind == KindWrite && op.Outcome == Refused:
			f.Refused++
		case op.Kind == KindWrite && op.Outcome != Failed:
			sent[key{op.Owner, op.Counter}] = append(sent[key{op.Owner, op.Counter}], op)
		}
		op.Lock = "" // the succession reads the leaders' lock as the run's own
		ops = append(ops, op)
	}
	succ := newSuccession(History{Ops: ops})
	ps := h.LeaderPermits
	var highest uint64
	var prev *Event
	for _, w := range h.LeaderObjects {
		if w.Type == "DELETED" {
			prev = nil
			continue
		}
		if p := prev; p != nil && w.Type == "MODIFIED" && w.Counter == p.Counter && w.Writer == p.Writer && w.FenceLock == p.FenceLock && w.Fence > p.Fence {
			f.Raises++
			prev = &w
			continue
		}
		prev = &w
		f.Writes++
		what := fmt.Sprintf("leaders: the write of counter %d by %s", w.Counter, w.Writer)
		if w.Fence == 0 || w.FenceLock != want {
			r.violate(fmt.Sprintf("%s (version %d) was stored with the record %q=%d, not one of lock %s", what, w.Version, w.FenceLock, w.Fence, want))
			continue
		}
		i := sort.Search(len(ps), func(i int) bool { return ps[i].Version >= w.Fence })
		if i == len(ps) || ps[i].Version != w.Fence || ps[i].Type == "DELETED" || ps[i].Deleting {
			r.violate(fmt.Sprintf("%s (version %d) was stored under token %d, which is no held version of the leaders' permit", what, w.Version, w.Fence))
			continue
		}
		if ps[i].Owner != w.Writer {
			r.violate(fmt.Sprintf("%s (version %d) was stored under token %d, a version held by %s", what, w.Version, w.Fence, ps[i].Owner))
			continue
		}
		attempts := sent[key{w.Writer, w.Counter}]
		if len(attempts) == 0 {
			r.violate(fmt.Sprintf("%s (version %d) matches no write a leader sent", what, w.Version))
			continue
		}
		call := attempts[0].Call
		for _, a := range attempts {
			call = min(call, a.Call)
		}
		bounded := false
		if i+1 < len(ps) && ps[i+1].Version < w.Version {
			if next := ps[i+1]; next.Seen < call {
				r.violate(fmt.Sprintf("%s (version %d, token %d) was sent at %s, after the permit had moved on to version %d (seen %s)",
					what, w.Version, w.Fence, stamp(call), next.Version, stamp(next.Seen)))
				continue
			}
			w.Token = w.Fence
			var reported bool
			if bounded, reported = r.checkLate(succ, ps, i, w, call, what); reported {
				continue
			}
			if !bounded {
				f.Window++
			}
		}
		if w.Fence < highest && !bounded {
			r.violate(fmt.Sprintf("%s: the leaders' ConfigMap accepted token %d at version %d after token %d", what, w.Fence, w.Version, highest))
		}
		highest = max(highest, w.Fence)
		if call-b.skew >= ps[i].ExpireTime {
			r.violate(fmt.Sprintf("%s (version %d) was sent at %s, after the lease of token %d ended at %s", what, w.Version, stamp(call), w.Fence, stamp(ps[i].ExpireTime)))
		}
	}
}

func printLeaders(row func(string, int), f LeaderFigures) {
	row("fenced leaders' terms (acquires answered)", f.Terms)
	row("  their renews answered", f.Renews)
	row("  their writes stored", f.Writes)
	row("  of them stored after the permit moved on, before the next acquire was answered", f.Window)
	row("  their writes refused (by the guard, or locally once lost)", f.Refused)
	row("  records raised by a leader's acquire", f.Raises)
}
