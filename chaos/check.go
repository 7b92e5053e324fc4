package chaos

import (
	"fmt"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// Report is what the checks found.
type Report struct {
	Ops        map[string]int // "kind/outcome" -> count
	Permits    int            // permit versions recorded
	Objects    int            // ConfigMap versions recorded
	Handovers  map[string]int // release, expiry, takeover
	Renewals   int
	Accepted   int // guarded writes stored
	Window     int // stored writes whose permit changed between the guard's read and the commit (docs/fencing.md)
	Resolved   int // lost answers settled from the record (linearizability)
	Dropped    int // lost answers that left no trace: not applied
	Open       int // lost answers left open (a release, or an expiry)
	Linearized string
	Violations []string
}

// Check runs every check over h. timeout bounds the linearizability search.
func Check(h History, timeout time.Duration) Report {
	r := Report{Ops: map[string]int{}, Handovers: map[string]int{}, Permits: len(h.Permits), Objects: len(h.Objects)}
	for _, op := range h.Ops {
		r.Ops[op.Kind+"/"+op.Outcome]++
		if op.BadCall {
			r.violate(fmt.Sprintf("harness: the route refused a call as malformed: %s", op))
		}
	}
	r.checkOrder(h)
	r.checkFences(h)
	r.checkHandovers(h)
	r.checkAcknowledged(h)
	ops, resolved, dropped := resolve(h.Ops, h.Permits)
	r.Resolved, r.Dropped = resolved, dropped
	for _, op := range ops {
		if op.Outcome == Unknown {
			r.Open++
		}
	}
	switch res, _ := checkLinearizable(ops, timeout); res {
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

// checkFences: the tokens the ConfigMap accepted never go down, and each
// was the permit's current token, on a lease that had not ended, when its
// write was admitted.
//
// A write sent after its token's lease ended (by the server's stamp) was
// admitted after it too: the guard must have refused it.
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
func (r *Report) checkFences(h History) {
	sent := map[[2]uint64][]Op{} // (token, counter) -> write attempts
	for _, op := range h.Ops {
		if op.Kind == KindWrite && op.Outcome != Failed && op.Outcome != Refused {
			k := [2]uint64{op.Token, uint64(op.Counter)}
			sent[k] = append(sent[k], op)
		}
	}
	var highest uint64
	for _, w := range h.Objects {
		if w.Type == "DELETED" || w.Token == 0 {
			continue
		}
		r.Accepted++
		if w.Token < highest {
			r.violate(fmt.Sprintf("fence: the ConfigMap accepted token %d at version %d after token %d", w.Token, w.Version, highest))
		}
		highest = max(highest, w.Token)
		if w.Fence != w.Token {
			r.violate(fmt.Sprintf("fence: version %d was written under token %d but records fence %d", w.Version, w.Token, w.Fence))
		}
		i := sort.Search(len(h.Permits), func(i int) bool { return h.Permits[i].Version >= w.Token })
		if i == len(h.Permits) || h.Permits[i].Version != w.Token || h.Permits[i].Type == "DELETED" {
			r.violate(fmt.Sprintf("fence: version %d of the ConfigMap was accepted under token %d, which is no version of the permit", w.Version, w.Token))
			continue
		}
		attempts := sent[[2]uint64{w.Token, uint64(w.Counter)}]
		if len(attempts) == 0 {
			r.violate(fmt.Sprintf("fence: version %d (token %d, counter %d) matches no write a client sent", w.Version, w.Token, w.Counter))
			continue
		}
		call := attempts[0].Call
		for _, a := range attempts {
			call = min(call, a.Call)
		}
		if end := h.Permits[i].ExpireTime; call >= end {
			r.violate(fmt.Sprintf("fence: the write of counter %d under token %d was sent at %s, after that lease ended at %s, and was still accepted",
				w.Counter, w.Token, stamp(call), stamp(end)))
			continue
		}
		if i+1 == len(h.Permits) || h.Permits[i+1].Version > w.Version {
			continue // still current at commit
		}
		next := h.Permits[i+1]
		if next.Seen < call {
			r.violate(fmt.Sprintf("fence: the write of counter %d under token %d was sent at %s, after the permit had moved on to version %d (%s, seen %s), and was still accepted",
				w.Counter, w.Token, stamp(call), next.Version, next.Type, stamp(next.Seen)))
			continue
		}
		r.Window++
	}
}

// checkHandovers: by the server-stamped times, no holder took the permit
// before the previous lease could have ended, unless the previous holder
// released it; and no renew landed after its lease had ended.
func (r *Report) checkHandovers(h History) {
	released := map[string][]int64{} // owner -> calls of its releases
	for _, op := range h.Ops {
		if op.Kind == KindRelease && op.Outcome != Failed {
			released[op.Owner] = append(released[op.Owner], op.Call)
		}
	}
	var prev *Event    // the live version, nil when the permit does not exist
	var deleted *Event // the last state before a delete
	for i := range h.Permits {
		e := &h.Permits[i]
		switch e.Type {
		case "DELETED":
			deleted, prev = e, nil
		case "ADDED":
			if deleted != nil {
				byRelease := false
				for _, call := range released[deleted.Owner] {
					byRelease = byRelease || call < deleted.Seen
				}
				if byRelease {
					r.Handovers["release"]++
				} else {
					r.Handovers["expiry"]++
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
			if e.AcquireTime != prev.AcquireTime {
				r.Handovers["takeover"]++
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
	for _, e := range h.Permits {
		versions[e.Version] = e
		if e.Type == "DELETED" {
			deletedOwners[e.Owner] = true
		}
	}
	objects := map[uint64]Event{}
	for _, e := range h.Objects {
		objects[e.Version] = e
	}
	for _, op := range h.Ops {
		switch op.Kind + "/" + op.Outcome {
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
