package main

import (
	"testing"
	"time"
)

// A semaphore holder's release, sent shortly before its lease's end,
// reached a replica whose clock was 400 ms ahead: it deleted the permit
// and answered lost. The slot's next holder was stamped by a replica
// 400 ms behind, before the first lease's expireTime. From a run of
// 2026-12-04, where it was reported as a fourth holder.
func TestASemaphoreReleaseAnsweredLostMayHaveFreedTheSlot(t *testing.T) {
	h := History{Grace: int64(time.Second), Skew: int64(400 * time.Millisecond)}
	for i, owner := range []string{"s0", "s1", "s2"} {
		h.Ops = append(h.Ops, semAcquire(i, owner, i, at(int64(i)), at(3005+int64(i)), uint64(100+i)))
		h.SemPermits = append(h.SemPermits, Event{Type: "ADDED", Version: uint64(100 + i), Slot: i, Seen: at(int64(i) + 8), Owner: owner,
			AcquireTime: at(1005 + int64(i)), RenewTime: at(1005 + int64(i)), ExpireTime: at(3005 + int64(i))})
	}
	h.Ops = append(h.Ops,
		Op{Client: 2, Lock: Semaphore, Kind: KindRelease, Owner: "s2", Slot: 2, Token: 102, Call: at(2300), Return: at(2700), Outcome: Lost},
		semAcquire(3, "s3", 2, at(2710), at(4310), 104))
	h.Ops[len(h.Ops)-1].Return = at(2720)
	h.SemPermits = append(h.SemPermits,
		Event{Type: "DELETED", Version: 103, Slot: 2, Seen: at(2650), Owner: "s2", AcquireTime: at(1007), RenewTime: at(1007), ExpireTime: at(3007)},
		Event{Type: "ADDED", Version: 104, Slot: 2, Seen: at(2718), Owner: "s3", AcquireTime: at(2310), RenewTime: at(2310), ExpireTime: at(4310)})
	if r := Check(h, 10*time.Second); len(r.Violations) != 0 || r.MostHolders != 3 {
		t.Fatalf("violations %q, most holders %d", r.Violations, r.MostHolders)
	}
	// Without the skew, a release answered lost cannot have freed a slot
	// before its lease's end: s3 is a fourth holder.
	h.Skew = 0
	mustFind(t, Check(h, 10*time.Second), "4 holders of chaos-sem (limit 3)")
}
