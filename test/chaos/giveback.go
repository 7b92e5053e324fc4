package main

import (
	"fmt"
	"strings"
	"time"
)

// RoleGaveBack is no client: Check makes a release of this role for an
// acquire the route gave back. Only an acquire sent without an owner is
// given back (the route minted its owner, which nobody else can learn to
// release it): when its caller hangs up before the answer and the acquire
// wins all the same, the route deletes the permit at the version its
// acquire made (internal/route, giveBack). An acquire that named its owner
// is never given back: its caller may have retried, been answered
// already with that very permit, and hold it. The semaphore clients hang
// up such acquires on purpose (client.go, hangUp) while the hold keeps
// their permit writes past the hang-up (hold.go), so every run gives back.
const RoleGaveBack = "gave-back"

// mintedPrefix begins every owner the route mints (locks.MintOwner).
const mintedPrefix = "route-"

// giveBackWithin bounds how long after its call a given-back acquire's
// lease is deleted: the acquire runs to its end (the route's operation
// timeout, 20 s, after its wait), then the release (20 s more).
const giveBackWithin = 45 * time.Second

// GiveBackFigures are what the checks found of the route's give-backs.
type GiveBackFigures struct {
	HungUp  int // acquires sent without an owner whose caller hung up
	Won     int // leases of minted owners the record shows (each a hung-up acquire's win)
	Back    int // of them given back: deleted before the expiry controller could have
	RanOut  int // of them deleted only when they may have expired
	Pending int // of them not deleted by the end of the record
}

// settleHangUps gives each lease of a minted owner the hung-up acquire
// that won it: the latest unmatched one of that lock sent before the
// lease was seen, within giveBackWithin. A minted owner's lease that no
// hung-up acquire explains is reported.
func (r *Report) settleHangUps(h *History) {
	ops := append([]Op(nil), h.Ops...)
	for _, op := range ops {
		if op.HungUp {
			r.GiveBack.HungUp++
		}
	}
	for _, l := range lockRecords(*h) {
		for i, e := range l.evs {
			if !strings.HasPrefix(e.Owner, mintedPrefix) || !leaseBegins(l.evs, i) {
				continue
			}
			r.GiveBack.Won++
			best := -1
			for j, op := range ops {
				if op.HungUp && op.Owner == e.Owner {
					best = j // settled already
					break
				}
				if op.HungUp && op.Owner == "" && op.Lock == l.op && op.Call < e.Seen && e.Seen-op.Call <= int64(giveBackWithin) {
					best = j
				}
			}
			if best < 0 {
				r.violate(fmt.Sprintf("give-back: %s version %d is a lease of %s, an owner the route minted, that no acquire sent without an owner explains", l.name, e.Version, e.Owner))
				continue
			}
			ops[best].Owner = e.Owner
		}
	}
	h.Ops = ops
}

// givenBack are the releases the route made of the hung-up acquires that
// won (settleHangUps named their owners): for each, the delete of its
// lease that no release or revoke of that owner explains, within
// giveBackWithin (plus the acquire's wait), as a release sent with the
// acquire and done by the time the watch saw the delete. Its outcome is
// released when the delete came before the expiry controller could have
// deleted the lease (its expireTime plus the grace, on a clock up to the
// skew ahead): nothing else deletes it. Later, it is unknown: the lease
// may have ended by expiry.
func givenBack(h History) []Op {
	var out []Op
	for _, l := range lockRecords(h) {
		for _, op := range h.Ops {
			if op.Kind != KindAcquire || !op.HungUp || op.Owner == "" || op.Lock != l.op {
				continue
			}
			begin := -1
			for i, e := range l.evs {
				if e.Owner == op.Owner && e.Seen > op.Call && leaseBegins(l.evs, i) {
					begin = i
					break
				}
			}
			if begin < 0 {
				continue
			}
			b := l.evs[begin]
			end := -1
			for j := begin + 1; j < len(l.evs); j++ {
				e := l.evs[j]
				if e.Slot != b.Slot {
					continue
				}
				if e.Type == "DELETED" || e.Deleting {
					end = j
				}
				if end >= 0 || e.Owner != b.Owner || e.AcquireTime != b.AcquireTime {
					break // deleted, or taken over: not given back
				}
			}
			if end < 0 {
				continue
			}
			d := l.evs[end]
			if d.Seen > op.Call+int64(giveBackWithin)+op.Wait*int64(time.Second) || releasedBefore(h.Ops, l.op, op.Owner, d.Seen) {
				continue
			}
			rel := Op{Client: op.Client, Role: RoleGaveBack, Lock: op.Lock, Slot: b.Slot, Kind: KindRelease, Owner: op.Owner,
				Token: b.Version, Call: op.Call, Return: d.Seen, Outcome: Released}
			if d.Seen >= b.ExpireTime+h.Grace-h.Skew {
				rel.Outcome, rel.Until = Unknown, d.Seen
			}
			out = append(out, rel)
		}
	}
	return out
}

// checkGiveBacks counts the give-backs, and checks that nothing frees a
// holding whose owner still holds it: a lease of an owner the client
// named (the route's holders', the semaphore's) is deleted only after a
// release or revoke of that owner was sent (a revoke of a pod gone
// included), or once it may have expired (its expireTime plus the grace,
// on a clock up to the skew ahead). A give-back of such an acquire, which
// its caller may hold by a retry answered already, would show here.
func (r *Report) checkGiveBacks(h History, back []Op) {
	for _, op := range back {
		if op.Outcome == Released {
			r.GiveBack.Back++
		} else {
			r.GiveBack.RanOut++
		}
	}
	r.GiveBack.Pending = r.GiveBack.Won - len(back)
	for _, l := range lockRecords(h) {
		live := map[int]Event{}
		for _, e := range l.evs {
			p, ok := live[e.Slot]
			if e.Type != "DELETED" && !e.Deleting {
				live[e.Slot] = e
				continue
			}
			delete(live, e.Slot)
			if !ok || isGatedOwner(p.Owner) || strings.HasPrefix(p.Owner, mintedPrefix) {
				continue // gated pods' ends are checkGated's
			}
			if e.Seen >= p.ExpireTime+h.Grace-h.Skew || releasedBefore(h.Ops, l.op, p.Owner, e.Seen) {
				continue
			}
			r.violate(fmt.Sprintf("give-back: %s slot %d: the lease of %s (version %d, expiring %s) was deleted at version %d (seen %s) with no release or revoke of its owner sent before: freed while its owner held it",
				l.name, e.Slot, p.Owner, p.Version, stamp(p.ExpireTime), e.Version, stamp(e.Seen)))
		}
	}
}

// leaseBegins tells whether evs[i] begins a lease of its slot: created,
// or taken over from another lease.
func leaseBegins(evs []Event, i int) bool {
	e := evs[i]
	if e.Type == "DELETED" || e.Deleting {
		return false
	}
	if e.Type == "ADDED" {
		return true
	}
	for j := i - 1; j >= 0; j-- {
		p := evs[j]
		if p.Slot != e.Slot {
			continue
		}
		return p.Type == "DELETED" || p.Deleting || p.Owner != e.Owner || p.AcquireTime != e.AcquireTime
	}
	return true
}

// releasedBefore tells whether a release or revoke of owner's permit of
// the lock whose Op.Lock is lock was sent before t.
func releasedBefore(ops []Op, lock, owner string, t int64) bool {
	for _, op := range ops {
		if op.Lock == lock && op.Owner == owner && (op.Kind == KindRelease || op.Kind == KindRevoke) && op.Outcome != Failed && op.Call < t {
			return true
		}
	}
	return false
}
