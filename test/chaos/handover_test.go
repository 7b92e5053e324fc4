package main

import (
	"testing"
	"time"
)

// handedHistory: a releases over the route while b waits; the route hands
// the permit to b's waiter in place (version 103), and b's carrier renews
// it to the lifetime b asked and answers acquired with that renew.
func handedHistory() History {
	h := goodHistory()
	h.Ops = []Op{
		h.Ops[0], h.Ops[1], h.Ops[2], h.Ops[3],
		{Client: 0, Kind: KindRelease, Owner: "a", Token: 102, Call: at(80), Return: at(90), Outcome: Released},
		{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Wait: 5, Call: at(30), Return: at(110), Outcome: Acquired, NewToken: 104, ExpiresAt: at(2105)},
		h.Ops[6],
	}
	h.Permits = []Event{
		h.Permits[0], h.Permits[1],
		{Type: "MODIFIED", Version: 103, Seen: at(88), Owner: "b", Waiter: "w-b", AcquireTime: at(85), RenewTime: at(85), ExpireTime: at(6085)},
		{Type: "MODIFIED", Version: 104, Seen: at(108), Owner: "b", Waiter: "w-b", AcquireTime: at(85), RenewTime: at(105), ExpireTime: at(2105)},
	}
	return h
}

func TestAHandoverInPlaceEndsOneHoldingAndBeginsTheNext(t *testing.T) {
	r := Check(handedHistory(), 10*time.Second)
	if len(r.Violations) != 0 || r.Linearized != "yes" {
		t.Fatalf("violations %q, linearized %s", r.Violations, r.Linearized)
	}
	if r.Handovers["in place"] != 1 || r.Handovers["release"] != 1 || r.Handovers["takeover"] != 0 || r.Renewals != 2 {
		t.Fatalf("handovers %v, renewals %d", r.Handovers, r.Renewals)
	}
}

func TestAHandoverBeforeTheHolderLetGoIsFound(t *testing.T) {
	// a never releases: the handover at 85 ms comes while its lease runs to
	// 2065 ms, which no waiter's name excuses.
	h := handedHistory()
	h.Ops = append(h.Ops[:4:4], h.Ops[5:]...)
	r := Check(h, 10*time.Second)
	mustFind(t, r, "handover: b acquired")
	if r.Linearized != "no" {
		t.Fatalf("linearized %s", r.Linearized)
	}
}

func TestOnlyANewHoldingThatNamesANewWaiterIsSplit(t *testing.T) {
	evs := []Event{
		{Type: "ADDED", Version: 1, Owner: "a", AcquireTime: 1},
		{Type: "MODIFIED", Version: 2, Owner: "b", Waiter: "w", AcquireTime: 2},  // handover
		{Type: "MODIFIED", Version: 3, Owner: "b", Waiter: "w", AcquireTime: 2},  // its renew
		{Type: "MODIFIED", Version: 4, Owner: "c", AcquireTime: 4},               // a takeover
		{Type: "ADDED", Version: 5, Slot: 1, Owner: "d", AcquireTime: 5},         // another slot
		{Type: "MODIFIED", Version: 6, Owner: "e", Waiter: "w2", AcquireTime: 6}, // handover of slot 0
	}
	out, n := splitHandovers(evs)
	if n != 2 || len(out) != 8 {
		t.Fatalf("split %d, %d events: %v", n, len(out), out)
	}
	want := []struct {
		typ   string
		v     uint64
		owner string
	}{{"ADDED", 1, "a"}, {"DELETED", 2, "a"}, {"ADDED", 2, "b"}, {"MODIFIED", 3, "b"}, {"MODIFIED", 4, "c"}, {"ADDED", 5, "d"}, {"DELETED", 6, "c"}, {"ADDED", 6, "e"}}
	for i, w := range want {
		if out[i].Type != w.typ || out[i].Version != w.v || out[i].Owner != w.owner {
			t.Fatalf("event %d: %s, want %s version %d of %s", i, out[i], w.typ, w.v, w.owner)
		}
	}
}
