package main

import (
	"strings"
	"time"
)

// RoleGaveBack is no client: Check makes an unknown release of this role
// for an acquire the route may have given back. A call whose caller goes
// away before its answer (its connection closed: a cut of the client's
// way to the route, or the client's own timeout) is carried out all the
// same, and the route then releases what it acquired, since nobody will
// receive the token (internal/route, giveBack). The client saw no answer,
// so its acquire is unknown; the record shows the lease begin and, soon
// after, its delete, which no operation of the client's accounts for.
const RoleGaveBack = "gave-back"

// giveBackWithin bounds how long after its call a given-back acquire's
// lease is deleted: the acquire runs to its end (the route's operation
// timeout, 20 s, after its wait), then the release (20 s more).
const giveBackWithin = 45 * time.Second

// givenBack are the releases the route may have made of acquires whose
// caller went away: for each acquire of the lock or the semaphore whose
// answer was lost without the route answering (no HTTP status), a lease
// of its owner that began after the call and was deleted within
// giveBackWithin (plus the acquire's wait) with no release or revoke of
// that owner sent before, a release of that lease, sent with the acquire
// and done by the time the watch saw the delete. Its outcome is released
// when the delete came before the expiry controller could have deleted
// the lease (its expireTime plus the grace, on a clock up to the skew
// ahead): nothing else deletes it. Later, it is unknown: the lease may
// have ended by expiry.
func givenBack(h History) []Op {
	var out []Op
	for _, l := range lockRecords(h) {
		for _, op := range h.Ops {
			if op.Kind != KindAcquire || op.Outcome != Unknown || op.Lock != l.op || op.Role == RoleGated ||
				strings.HasPrefix(op.Error, "route answered") {
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
