package main

import (
	"testing"
)

// leaderHistory: l0.1 leads (version 10), writes (11), renews (12); its
// lease runs out and l1.1 takes over (13, answered at 3100 ms), renews
// (14, sent at 3200 ms) and writes (15). With stale, l0.1's write sent at
// 900 ms under token 12 is held and stored at 16, after l1.1's renew.
func leaderHistory(stale bool) History {
	h := History{
		Ops: []Op{
			{Client: 7, Role: RoleLeader, Lock: LeaderLock, Kind: KindAcquire, Owner: "l0.1", TTL: 3, Call: at(0), Return: at(10), Outcome: Acquired, NewToken: 10},
			{Client: 7, Role: RoleLeader, Lock: LeaderLock, Kind: KindWrite, Owner: "l0.1", Token: 10, Counter: 1, Create: true, Call: at(100), Return: at(110), Outcome: Written, Version: 11},
			{Client: 7, Role: RoleLeader, Lock: LeaderLock, Kind: KindRenew, Owner: "l0.1", Token: 10, TTL: 3, Call: at(500), Return: at(510), Outcome: Renewed, NewToken: 12},
			{Client: 8, Role: RoleLeader, Lock: LeaderLock, Kind: KindAcquire, Owner: "l1.1", TTL: 3, Call: at(3000), Return: at(3100), Outcome: Acquired, NewToken: 13},
			{Client: 8, Role: RoleLeader, Lock: LeaderLock, Kind: KindRenew, Owner: "l1.1", Token: 13, TTL: 3, Call: at(3200), Return: at(3210), Outcome: Renewed, NewToken: 14},
			{Client: 8, Role: RoleLeader, Lock: LeaderLock, Kind: KindWrite, Owner: "l1.1", Token: 14, Counter: 2, Call: at(3300), Return: at(3310), Outcome: Written, Version: 15},
		},
		LeaderPermits: []Event{
			{Type: "ADDED", Version: 10, Seen: at(8), Owner: "l0.1", AcquireTime: at(5), RenewTime: at(5), ExpireTime: at(3005)},
			{Type: "MODIFIED", Version: 12, Seen: at(508), Owner: "l0.1", AcquireTime: at(5), RenewTime: at(505), ExpireTime: at(3505)},
			{Type: "MODIFIED", Version: 13, Seen: at(3090), Owner: "l1.1", AcquireTime: at(3050), RenewTime: at(3050), ExpireTime: at(6050)},
			{Type: "MODIFIED", Version: 14, Seen: at(3205), Owner: "l1.1", AcquireTime: at(3050), RenewTime: at(3202), ExpireTime: at(6202)},
		},
		LeaderObjects: []Event{
			{Type: "ADDED", Version: 11, Seen: at(108), Counter: 1, Writer: "l0.1", Fence: 10, FenceLock: "chaos-leader#0"},
			{Type: "MODIFIED", Version: 15, Seen: at(3308), Counter: 2, Writer: "l1.1", Fence: 14, FenceLock: "chaos-leader#0"},
		},
	}
	if stale {
		h.Ops = append(h.Ops, Op{Client: 7, Role: RoleLeader, Lock: LeaderLock, Kind: KindWrite, Owner: "l0.1", Token: 12, Counter: 2, Call: at(900), Return: at(3500), Outcome: Unknown})
		h.LeaderObjects = append(h.LeaderObjects, Event{Type: "MODIFIED", Version: 16, Seen: at(3400), Counter: 2, Writer: "l0.1", Fence: 12, FenceLock: "chaos-leader#0"})
	}
	return h
}

func TestAReplacedLeadersWriteStoredAfterTheNextLeaderWasAnsweredIsAViolation(t *testing.T) {
	r := Report{}
	r.checkLeaders(leaderHistory(false), bounds{})
	if len(r.Violations) != 0 || r.Leaders.Writes != 2 || r.Leaders.Terms != 2 {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Leaders)
	}
	r = Report{}
	r.checkLeaders(leaderHistory(true), bounds{})
	mustFind(t, r, "leaders: the write of counter 2 by l0.1 (version 16, token 12) was stored after l1.1's acquire (version 13) was answered")
}
