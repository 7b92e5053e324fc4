package main

import (
	"sort"
	"strings"
	"time"
)

// A handover (docs/line.md) ends one holding and begins the next in one
// write: a MODIFIED that names a waiter the permit was not handed to
// before, with a new acquireTime and usually a new owner. The checks read
// holdings as ADDED ... DELETED, and a new acquireTime on a MODIFIED as a
// takeover, which must wait for the old lease to end; a handover need not,
// because the old holding ended by the very release, expiry or pod's end
// that wrote it. splitHandovers makes each one what it is to the checks:
// the end of the old holding (a DELETED carrying the old state) and the
// start of the new (an ADDED), both at the handover's version and seen
// together. Whether the old holding had ended is then judged as for any
// delete: by a release or a pod's end sent before it, or by expiry.

// splitHandovers answers evs (one lock's permits, any number of slots, in
// commit order) with every handover split in two, and how many it split.
func splitHandovers(evs []Event) ([]Event, int) {
	live := map[int]*Event{} // slot -> its live version
	var out []Event
	n := 0
	for i := range evs {
		e := evs[i]
		prev := live[e.Slot]
		if e.Type == "MODIFIED" && prev != nil && !e.Deleting && !prev.Deleting && isHandover(prev, &e) {
			end := *prev
			end.Type, end.Version, end.Seen, end.Handover = "DELETED", e.Version, e.Seen, true
			e.Type, e.Handover = "ADDED", true
			out = append(out, end, e)
			n++
		} else {
			out = append(out, e)
		}
		if e.Type == "DELETED" {
			delete(live, e.Slot)
		} else {
			live[e.Slot] = &evs[i]
		}
	}
	return out, n
}

// isHandover tells whether e, written over the live version prev, handed
// the permit to a waiter: a new holding (a new acquireTime) that names a
// waiter prev did not.
func isHandover(prev, e *Event) bool {
	return e.Waiter != "" && e.Waiter != prev.Waiter && e.AcquireTime != prev.AcquireTime
}

// atVersion is the index in evs (in commit order) of the event of version
// v, or len(evs) if none: of a handover's two halves, the start of the new
// holding, which is what that version is from then on.
func atVersion(evs []Event, v uint64) int {
	i := sort.Search(len(evs), func(i int) bool { return evs[i].Version > v }) - 1
	if i < 0 || evs[i].Version != v {
		return len(evs)
	}
	return i
}

// RoleLeftWaiter is no client: Check makes an acquire of this role for a
// holding handed in place to a waiter whose call had already answered
// without it (its wait ran out, answered held, a moment before: the
// manager read the line before the waiter's delete landed), and for a
// second slot a waiting acquire won while it was being handed another
// (its own try, as the handover landed), which settle deletes. Nobody was
// told of that holding; it is held all the same, by the waiter's owner,
// until its short lifetime (the waiter's ttlSeconds) runs out, the owner's
// carrier gives it back, or it is handed on. The acquire made for it is
// sent when the owner's last acquire was and answered by the time the
// watch saw the handover; if the holding ends before its lifetime, a
// release of this role (unknown: the carrier's give-back) is made too.
const RoleLeftWaiter = "left-waiter"

// leftWaiterClient numbers the clients of those operations.
const leftWaiterClient = -3000

// handedToLeft are those operations, for every holding a handover began
// that no answered or open acquire of its owner accounts for. Gated
// pods' holdings are gatedOps', minted owners' settleHangUps'.
func handedToLeft(h History) []Op {
	var out []Op
	for _, l := range lockRecords(h) {
		for i, e := range l.evs {
			if !leaseBegins(l.evs, i) || isGatedOwner(e.Owner) || strings.HasPrefix(e.Owner, mintedPrefix) {
				continue
			}
			// The versions of this holding, and how it ended.
			versions := map[uint64]bool{e.Version: true}
			var end *Event
			for j := i + 1; j < len(l.evs); j++ {
				f := l.evs[j]
				if f.Slot != e.Slot {
					continue
				}
				if f.Type == "DELETED" || f.Deleting || f.Owner != e.Owner || f.AcquireTime != e.AcquireTime {
					end = &l.evs[j]
					break
				}
				versions[f.Version] = true
			}
			call, known, settled := int64(0), false, false
			for _, op := range h.Ops {
				if op.Kind != KindAcquire || op.Owner != e.Owner || op.Lock != l.op {
					continue
				}
				if op.Outcome == Unknown || ((op.Outcome == Acquired || op.Outcome == Already) && versions[op.NewToken]) {
					known = true
					break
				}
				if op.Call < e.Seen {
					call = max(call, op.Call)
				}
				// In flight when the holding began, and answered another:
				// the owner won two slots (its own try and a handover) and
				// the acquire kept the earlier (settle) and deleted this.
				settled = settled || (op.Outcome == Acquired || op.Outcome == Already) && op.Call < e.Seen && e.Seen <= op.Return+int64(time.Second)
			}
			if known || call == 0 || (!e.Handover && !settled) {
				continue
			}
			n := leftWaiterClient - len(out)
			acq := Op{Client: n, Role: RoleLeftWaiter, Lock: l.op, Slot: e.Slot, Kind: KindAcquire, Owner: e.Owner,
				TTL: seconds(e.ExpireTime - e.AcquireTime), Call: call, Return: e.Seen, Outcome: Acquired, NewToken: e.Version, ExpiresAt: e.ExpireTime}
			if l.limit > 1 {
				acq.Limit = l.limit
			}
			out = append(out, acq)
			if end != nil && end.Seen < e.ExpireTime+h.Grace-h.Skew && !releasedBefore(h.Ops, l.op, e.Owner, end.Seen) {
				out = append(out, Op{Client: n, Role: RoleLeftWaiter, Lock: l.op, Slot: e.Slot, Kind: KindRelease, Owner: e.Owner,
					Token: e.Version, Call: e.Seen, Return: end.Seen, Until: end.Seen, Outcome: Unknown})
			}
		}
	}
	return out
}
