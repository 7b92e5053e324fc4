package main

import (
	"testing"
	"time"
)

// givenBackHistory: a holds and releases; b sends an acquire without an
// owner and hangs up before the answer; the route takes the lock for the
// owner it minted (version 102) after b left, and gives it back (seen at
// 630 ms); c acquires and releases; b, as owner b, acquires. From a run of
// 2026-12-04 (where b had named its owner, which the route no longer
// gives back), reported then as c's acquire of a lease "not released".
func givenBackHistory() History {
	return History{
		Grace: int64(time.Second),
		Ops: []Op{
			{Client: 0, Kind: KindAcquire, Owner: "a", TTL: 2, Call: at(0), Return: at(10), Outcome: Acquired, NewToken: 100, ExpiresAt: at(2005)},
			{Client: 0, Kind: KindRelease, Owner: "a", Token: 100, Call: at(500), Return: at(510), Outcome: Released},
			{Client: 1, Kind: KindAcquire, TTL: 2, Call: at(600), Return: at(610), Outcome: Unknown, HungUp: true, Error: `Post "http://127.0.0.1:1/api/v1/locks": context deadline exceeded`},
			{Client: 2, Kind: KindAcquire, Owner: "c", TTL: 2, Call: at(640), Return: at(650), Outcome: Acquired, NewToken: 104, ExpiresAt: at(2645)},
			{Client: 2, Kind: KindRelease, Owner: "c", Token: 104, Call: at(700), Return: at(710), Outcome: Released},
			{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(800), Return: at(810), Outcome: Acquired, NewToken: 106, ExpiresAt: at(2805)},
			{Client: 1, Kind: KindRelease, Owner: "b", Token: 106, Call: at(900), Return: at(910), Outcome: Released},
		},
		Permits: []Event{
			{Type: "ADDED", Version: 100, Seen: at(8), Owner: "a", AcquireTime: at(5), RenewTime: at(5), ExpireTime: at(2005)},
			{Type: "DELETED", Version: 101, Seen: at(505), Owner: "a", AcquireTime: at(5), RenewTime: at(5), ExpireTime: at(2005)},
			{Type: "ADDED", Version: 102, Seen: at(620), Owner: "route-b1", AcquireTime: at(615), RenewTime: at(615), ExpireTime: at(2615)},
			{Type: "DELETED", Version: 103, Seen: at(630), Owner: "route-b1", AcquireTime: at(615), RenewTime: at(615), ExpireTime: at(2615)},
			{Type: "ADDED", Version: 104, Seen: at(648), Owner: "c", AcquireTime: at(645), RenewTime: at(645), ExpireTime: at(2645)},
			{Type: "DELETED", Version: 105, Seen: at(705), Owner: "c", AcquireTime: at(645), RenewTime: at(645), ExpireTime: at(2645)},
			{Type: "ADDED", Version: 106, Seen: at(808), Owner: "b", AcquireTime: at(805), RenewTime: at(805), ExpireTime: at(2805)},
			{Type: "DELETED", Version: 107, Seen: at(905), Owner: "b", AcquireTime: at(805), RenewTime: at(805), ExpireTime: at(2805)},
		},
	}
}

func TestAnAcquireWhoseCallerWentAwayMayBeGivenBack(t *testing.T) {
	h := givenBackHistory()
	var r0 Report
	r0.settleHangUps(&h)
	back := givenBack(h)
	if len(back) != 1 || back[0].Owner != "route-b1" || back[0].Token != 102 || back[0].Outcome != Released || back[0].Call != at(600) || back[0].Return != at(630) {
		t.Fatalf("given back: %v", back)
	}
	r := Check(h, 10*time.Second)
	if len(r.Violations) != 0 || r.Linearized != "yes" || r.GaveBack != 1 || r.GiveBack.Back != 1 || r.GiveBack.HungUp != 1 || r.GiveBack.Won != 1 {
		t.Fatalf("violations %q, linearized %s, gave back %d %+v", r.Violations, r.Linearized, r.GaveBack, r.GiveBack)
	}
}

// A give-back of an acquire that named its owner (issue 41: the caller
// retried, was answered already with that very permit, and holds it) is
// a lease freed while its owner held it.
func TestAGiveBackOfANamedOwnersAcquireIsFound(t *testing.T) {
	h := givenBackHistory()
	h.Ops[2].Owner, h.Ops[2].HungUp = "b", false
	h.Ops = append(h.Ops, Op{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(612), Return: at(625), Outcome: Already, NewToken: 102, ExpiresAt: at(2615)})
	sortOps(h.Ops)
	for i := range h.Permits {
		if h.Permits[i].Owner == "route-b1" {
			h.Permits[i].Owner = "b"
		}
	}
	if back := givenBack(h); len(back) != 0 {
		t.Fatalf("given back: %v", back)
	}
	mustFind(t, Check(h, 10*time.Second), "freed while its owner held it")
}

// A lease of a minted owner that no hung-up acquire explains is reported.
func TestAMintedOwnersLeaseNeedsAHungUpAcquire(t *testing.T) {
	h := givenBackHistory()
	h.Ops[2].HungUp = false
	mustFind(t, Check(h, 10*time.Second), "that no acquire sent without an owner explains")
}

func TestOnlyAHungUpAcquireIsGivenBack(t *testing.T) {
	settled := func(h History) History {
		var r Report
		r.settleHangUps(&h)
		return h
	}
	// An acquire that named its owner is never given back, answered or
	// not: the delete has no cause.
	h := givenBackHistory()
	h.Ops[2].Owner, h.Ops[2].HungUp = "route-b1", false
	if back := givenBack(settled(h)); len(back) != 0 {
		t.Fatalf("given back: %v", back)
	}
	mustFind(t, Check(h, 10*time.Second), "handover: c acquired")

	// A delete long after the call is not the route's give-back.
	h = givenBackHistory()
	h.Ops[2].Call, h.Ops[2].Return = at(600)-int64(giveBackWithin)-int64(time.Second), at(610)-int64(giveBackWithin)
	if back := givenBack(settled(h)); len(back) != 0 {
		t.Fatalf("given back: %v", back)
	}

	// Past the lease's expiry and the grace the delete may be the expiry
	// controller's: the give-back is unknown.
	h = givenBackHistory()
	h.Permits[3].Seen = at(3700)
	for i := 4; i < len(h.Permits); i++ {
		h.Permits[i].Seen += int64(3 * time.Second)
		h.Permits[i].AcquireTime += int64(3 * time.Second)
		h.Permits[i].RenewTime += int64(3 * time.Second)
		h.Permits[i].ExpireTime += int64(3 * time.Second)
	}
	for i := 3; i < len(h.Ops); i++ {
		h.Ops[i].Call += int64(3 * time.Second)
		h.Ops[i].Return += int64(3 * time.Second)
		if h.Ops[i].ExpiresAt != 0 {
			h.Ops[i].ExpiresAt += int64(3 * time.Second)
		}
	}
	if back := givenBack(settled(h)); len(back) != 1 || back[0].Outcome != Unknown || back[0].Until != at(3700) {
		t.Fatalf("given back: %v", back)
	}
	if r := Check(h, 10*time.Second); len(r.Violations) != 0 || r.Linearized != "yes" {
		t.Fatalf("violations %q, linearized %s", r.Violations, r.Linearized)
	}
}
