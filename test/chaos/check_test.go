package main

import (
	"strings"
	"testing"
	"time"
)

// base is an arbitrary instant; at(ms) is ms milliseconds after it.
var base = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC).UnixNano()

func at(ms int64) int64 { return base + ms*int64(time.Millisecond) }

// goodHistory: a acquires, writes, renews and releases; b, refused while a
// holds, acquires after the release and writes.
func goodHistory() History {
	return History{
		Ops: []Op{
			{Client: 0, Kind: KindAcquire, Owner: "a", TTL: 2, Call: at(0), Return: at(10), Outcome: Acquired, NewToken: 100, ExpiresAt: at(2005)},
			{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(20), Return: at(30), Outcome: Held, HolderOwner: "a", HolderToken: 100, HolderExpires: at(2005)},
			{Client: 0, Kind: KindWrite, Owner: "a", Token: 100, Guard: "chaos#0=100", Call: at(40), Return: at(50), Outcome: Written, Counter: 1, Version: 101},
			{Client: 0, Kind: KindRenew, Owner: "a", Token: 100, TTL: 2, Call: at(60), Return: at(70), Outcome: Renewed, NewToken: 102, ExpiresAt: at(2065)},
			{Client: 0, Kind: KindRelease, Owner: "a", Token: 102, Call: at(80), Return: at(90), Outcome: Released},
			{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(100), Return: at(110), Outcome: Acquired, NewToken: 104, ExpiresAt: at(2105)},
			{Client: 1, Kind: KindWrite, Owner: "b", Token: 104, Guard: "chaos#0=104", Call: at(120), Return: at(130), Outcome: Written, Counter: 2, Version: 105},
		},
		Permits: []Event{
			{Type: "ADDED", Version: 100, Seen: at(8), Owner: "a", AcquireTime: at(5), RenewTime: at(5), ExpireTime: at(2005)},
			{Type: "MODIFIED", Version: 102, Seen: at(68), Owner: "a", AcquireTime: at(5), RenewTime: at(65), ExpireTime: at(2065)},
			{Type: "DELETED", Version: 103, Seen: at(88), Owner: "a", AcquireTime: at(5), RenewTime: at(65), ExpireTime: at(2065)},
			{Type: "ADDED", Version: 104, Seen: at(108), Owner: "b", AcquireTime: at(105), RenewTime: at(105), ExpireTime: at(2105)},
		},
		Objects: []Event{
			{Type: "MODIFIED", Version: 101, Seen: at(48), Counter: 1, Token: 100, Writer: "a", Fence: 100, FenceLock: "chaos#0"},
			{Type: "MODIFIED", Version: 105, Seen: at(128), Counter: 2, Token: 104, Writer: "b", Fence: 104, FenceLock: "chaos#0"},
		},
	}
}

func mustFind(t *testing.T, r Report, want string) {
	t.Helper()
	for _, v := range r.Violations {
		if strings.Contains(v, want) {
			return
		}
	}
	t.Fatalf("no violation containing %q; got %q", want, r.Violations)
}

func TestGoodHistoryPasses(t *testing.T) {
	r := Check(goodHistory(), 10*time.Second)
	if len(r.Violations) != 0 || r.Linearized != "yes" {
		t.Fatalf("violations %q, linearized %s", r.Violations, r.Linearized)
	}
	if r.Accepted != 2 || r.Handovers["release"] != 1 || r.Renewals != 1 || r.Window != 0 {
		t.Fatalf("figures: accepted %d, handovers %v, renewals %d, window %d", r.Accepted, r.Handovers, r.Renewals, r.Window)
	}
}

func TestStaleWriteAfterNewerHolderIsFound(t *testing.T) {
	h := goodHistory()
	h.Ops = append(h.Ops, Op{Client: 0, Kind: KindWrite, Owner: "a", Token: 102, Guard: "chaos#0=102", Call: at(140), Return: at(150), Outcome: Written, Counter: 3, Version: 106})
	h.Objects = append(h.Objects, Event{Type: "MODIFIED", Version: 106, Seen: at(148), Counter: 3, Token: 102, Writer: "a", Fence: 102, FenceLock: "chaos#0"})
	r := Check(h, 10*time.Second)
	mustFind(t, r, "accepted token 102 at version 106 after token 104")
	mustFind(t, r, "after the permit had moved on to version 103")
}

func TestWriteUnderReplacedTokenIsFound(t *testing.T) {
	// The permit was released (version 103, seen at 88 ms); a write under
	// token 102 sent at 95 ms must not be stored, even before b writes.
	h := goodHistory()
	h.Ops = append(h.Ops[:6], Op{Client: 0, Kind: KindWrite, Owner: "a", Token: 102, Guard: "chaos#0=102", Call: at(95), Return: at(99), Outcome: Written, Counter: 2, Version: 106})
	h.Objects = append(h.Objects[:1], Event{Type: "MODIFIED", Version: 106, Seen: at(98), Counter: 2, Token: 102, Writer: "a", Fence: 102, FenceLock: "chaos#0"})
	r := Check(h, 10*time.Second)
	mustFind(t, r, "was sent at")
	if r.Window != 0 {
		t.Fatalf("window %d", r.Window)
	}
}

func TestWriteAfterTheLeaseEndedIsFound(t *testing.T) {
	// b's lease (token 104) ends at 2105 ms; nobody took over, but a write
	// sent at 2200 ms must not be stored.
	h := goodHistory()
	h.Ops[6].Call, h.Ops[6].Return = at(2200), at(2210)
	h.Objects[1].Seen = at(2208)
	mustFind(t, Check(h, 10*time.Second), "after that lease ended")
}

func TestWriteInTheWindowIsCountedNotFlagged(t *testing.T) {
	// Sent at 85 ms, before the release was seen (88 ms), committed after it.
	h := goodHistory()
	h.Ops = append(h.Ops[:6], Op{Client: 0, Kind: KindWrite, Owner: "a", Token: 102, Guard: "chaos#0=102", Call: at(85), Return: at(99), Outcome: Unknown, Counter: 2})
	h.Objects = append(h.Objects[:1], Event{Type: "MODIFIED", Version: 106, Seen: at(98), Counter: 2, Token: 102, Writer: "a", Fence: 102, FenceLock: "chaos#0"})
	r := Check(h, 10*time.Second)
	if len(r.Violations) != 0 || r.Window != 1 {
		t.Fatalf("violations %q, window %d", r.Violations, r.Window)
	}
}

func TestEarlyHandoverIsFound(t *testing.T) {
	// a never releases; b acquires at 1000 ms though a's lease runs to 2065.
	h := goodHistory()
	h.Ops = append(h.Ops[:4:4], Op{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(990), Return: at(1010), Outcome: Acquired, NewToken: 104, ExpiresAt: at(3000)})
	h.Permits[2].Seen = at(900)
	h.Permits[3] = Event{Type: "ADDED", Version: 104, Seen: at(1008), Owner: "b", AcquireTime: at(1000), RenewTime: at(1000), ExpireTime: at(3000)}
	h.Objects = h.Objects[:1]
	r := Check(h, 10*time.Second)
	mustFind(t, r, "handover: b acquired")
	if r.Linearized != "no" {
		t.Fatalf("linearized %s", r.Linearized)
	}
}

func TestTakeoverBeforeExpiryIsFound(t *testing.T) {
	h := goodHistory()
	h.Permits = []Event{
		h.Permits[0],
		{Type: "MODIFIED", Version: 102, Seen: at(68), Owner: "b", AcquireTime: at(65), RenewTime: at(65), ExpireTime: at(2065)},
	}
	r := Check(h, 10*time.Second)
	mustFind(t, r, "handover: b took over")
}

func TestRenewAfterExpiryIsFound(t *testing.T) {
	h := goodHistory()
	h.Permits[1].RenewTime = at(2010)
	mustFind(t, Check(h, 10*time.Second), "after its lease ended")
}

func TestLostAcknowledgementsAreFound(t *testing.T) {
	h := goodHistory()
	h.Permits = append(h.Permits[:2:2], h.Permits[3]) // the release's delete is gone
	h.Objects = h.Objects[:1]                         // and b's write
	r := Check(h, 10*time.Second)
	mustFind(t, r, "no delete of a's permit")
	mustFind(t, r, "the ConfigMap has no such version")
}

func TestTwoHoldersAtOnceAreNotLinearizable(t *testing.T) {
	h := goodHistory()
	// b is told it acquired while a holds a live lease.
	h.Ops[1] = Op{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(20), Return: at(30), Outcome: Acquired, NewToken: 101, ExpiresAt: at(2025)}
	res, _ := checkLinearizable(h.Ops, bounds{}, 10*time.Second)
	if res != "Illegal" {
		t.Fatalf("result %v", res)
	}
}

func TestUnknownOperationsMayOrMayNotApply(t *testing.T) {
	h := goodHistory()
	// c2's acquire lost its answer; later b is told c2 holds the lease.
	ops := append([]Op{}, h.Ops[:5]...)
	ops = append(ops,
		Op{Client: 2, Kind: KindAcquire, Owner: "c", TTL: 2, Call: at(91), Return: at(120), Outcome: Unknown},
		Op{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(130), Return: at(140), Outcome: Held, HolderOwner: "c", HolderToken: 104, HolderExpires: at(2100)},
		// and an unknown release by a, which cannot have applied: a no longer holds.
		Op{Client: 0, Kind: KindRelease, Owner: "a", Token: 102, Call: at(150), Return: at(160), Outcome: Unknown},
	)
	if res, _ := checkLinearizable(ops, bounds{}, 10*time.Second); res != "Ok" {
		t.Fatalf("with c's acquire applied: %v", res)
	}
	// Without c's acquire the held answer has no cause.
	if res, _ := checkLinearizable(append(ops[:5:5], ops[6]), bounds{}, 10*time.Second); res != "Illegal" {
		t.Fatalf("without c's acquire: %v", res)
	}
}

func TestUnknownAcquireDoesNotExcuseAnEarlyTakeover(t *testing.T) {
	// a's first acquire lost its answer, the second won; b acquiring
	// before a's lease ends is wrong whatever the first one did.
	ops := []Op{
		{Client: 0, Kind: KindAcquire, Owner: "a", TTL: 2, Call: at(0), Return: at(5), Outcome: Unknown},
		{Client: 0, Kind: KindAcquire, Owner: "a", TTL: 2, Call: at(200), Return: at(210), Outcome: Acquired, NewToken: 100, ExpiresAt: at(2205)},
		{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(1000), Return: at(1010), Outcome: Acquired, NewToken: 102, ExpiresAt: at(3005)},
	}
	if res, _ := checkLinearizable(ops, bounds{}, 10*time.Second); res != "Illegal" {
		t.Fatalf("result %v", res)
	}
	// After a's lease has ended, b may take it.
	ops[2].Call, ops[2].Return, ops[2].ExpiresAt = at(2300), at(2310), at(4305)
	if res, _ := checkLinearizable(ops, bounds{}, 10*time.Second); res != "Ok" {
		t.Fatalf("result %v", res)
	}
}

func TestLostAnswersAreSettledFromTheRecord(t *testing.T) {
	h := goodHistory()
	// a's acquire lost its answer but created version 100; b's first
	// acquire lost its answer and left nothing.
	h.Ops[0].Outcome, h.Ops[0].NewToken, h.Ops[0].ExpiresAt = Unknown, 0, 0
	h.Ops = append(h.Ops, Op{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(15), Return: at(16), Outcome: Unknown})
	ops, resolved, dropped := resolve(h.Ops, h.Permits)
	if resolved != 1 || dropped != 1 || len(ops) != len(h.Ops)-1 {
		t.Fatalf("resolved %d, dropped %d, %d ops", resolved, dropped, len(ops))
	}
	if ops[0].Outcome != Acquired || ops[0].NewToken != 100 || ops[0].ExpiresAt != at(2005) || ops[0].Return != at(8) {
		t.Fatalf("a's acquire settled as %s", ops[0])
	}
	if r := Check(h, 10*time.Second); len(r.Violations) != 0 || r.Linearized != "yes" {
		t.Fatalf("violations %q, linearized %s", r.Violations, r.Linearized)
	}
}

func TestAnUnknownReleaseIsBoundedByTheDelete(t *testing.T) {
	h := goodHistory()
	// a's release lost its answer; the permit's delete was seen at 88 ms,
	// so whatever the release did, it did by then.
	h.Ops[4].Outcome = Unknown
	ops, _, _ := resolve(h.Ops, h.Permits)
	var found bool
	for _, op := range lockOps(ops) {
		if in := op.Input.(Op); in.Kind == KindRelease {
			found = true
			if op.Return != at(88) {
				t.Fatalf("the release returns at %s, want the delete's %s", stamp(op.Return), stamp(at(88)))
			}
		}
	}
	if !found {
		t.Fatal("the unknown release was dropped")
	}
	if r := Check(h, 10*time.Second); len(r.Violations) != 0 || r.Open != 1 {
		t.Fatalf("violations %q, open %d", r.Violations, r.Open)
	}
}

func TestAWriteWithoutAGuardOrUnderAnotherLockIsFound(t *testing.T) {
	h := goodHistory()
	// Stored without a record: an unguarded write got through.
	h.Ops = append(h.Ops, Op{Client: 2, Role: RoleUnguarded, Kind: KindWrite, Owner: "u2.1", Call: at(140), Return: at(150), Outcome: Written, Counter: 3, Version: 106})
	h.Objects = append(h.Objects, Event{Type: "MODIFIED", Version: 106, Seen: at(148), Counter: 3, Writer: "u2.1"})
	mustFind(t, Check(h, 10*time.Second), `(writer "u2.1", token 0) was stored with the record ""=0`)

	// Stored under a guard of another lock, held at the time.
	h = goodHistory()
	h.Ops = append(h.Ops, Op{Client: 3, Role: RoleOtherLock, Lock: OtherLock, Kind: KindWrite, Owner: "o3.1", Token: 107, Guard: "chaos-other#0=107",
		Call: at(140), Return: at(150), Outcome: Written, Counter: 3, Version: 108})
	h.Objects = append(h.Objects, Event{Type: "MODIFIED", Version: 108, Seen: at(148), Counter: 3, Token: 107, Writer: "o3.1", Fence: 107, FenceLock: "chaos-other#0"})
	mustFind(t, Check(h, 10*time.Second), `record "chaos-other#0"=107, not one of lock chaos#0`)
}

// deleteHistory: b marks the object deletable under its token 104, deletes
// it and creates it again.
func deleteHistory() History {
	h := goodHistory()
	h.Ops = append(h.Ops,
		Op{Client: 1, Kind: KindWrite, Owner: "b", Token: 104, Guard: "chaos#0=104", Deletable: true, Call: at(140), Return: at(150), Outcome: Written, Counter: 3, Version: 106},
		Op{Client: 1, Kind: KindDelete, Owner: "b", Token: 104, Call: at(160), Return: at(170), Outcome: Deleted},
		Op{Client: 1, Kind: KindWrite, Owner: "b", Token: 104, Guard: "chaos#0=104", Create: true, Call: at(180), Return: at(190), Outcome: Written, Counter: 1, Version: 108},
	)
	h.Objects = append(h.Objects,
		Event{Type: "MODIFIED", Version: 106, Seen: at(148), Counter: 3, Token: 104, Writer: "b", Fence: 104, FenceLock: "chaos#0", Deletable: "104"},
		Event{Type: "DELETED", Version: 107, Seen: at(168), Counter: 3, Token: 104, Writer: "b", Fence: 104, FenceLock: "chaos#0", Deletable: "104"},
		Event{Type: "ADDED", Version: 108, Seen: at(188), Counter: 1, Token: 104, Writer: "b", Fence: 104, FenceLock: "chaos#0"},
	)
	return h
}

func TestDeletesOfTheGuardedObject(t *testing.T) {
	r := Check(deleteHistory(), 10*time.Second)
	if len(r.Violations) != 0 || r.Deletes != 1 || r.Accepted != 4 {
		t.Fatalf("violations %q, deletes %d, accepted %d", r.Violations, r.Deletes, r.Accepted)
	}

	// Deleted though the last write did not mark it.
	h := deleteHistory()
	h.Objects[3].Deletable, h.Objects[2].Deletable = "", ""
	mustFind(t, Check(h, 10*time.Second), "had not marked it deletable")

	// Deleted under a mark whose token had been replaced before the delete
	// was sent: a takes over at 150 ms, b's delete is sent at 160 ms.
	h = deleteHistory()
	h.Permits = append(h.Permits, Event{Type: "MODIFIED", Version: 105, Seen: at(152), Owner: "c", AcquireTime: at(150), RenewTime: at(150), ExpireTime: at(2150)})
	h.Objects[1].Version = 109 // keep versions unique: b's first write
	mustFind(t, Check(h, 10*time.Second), "after the permit had moved on")

	// A replaced holder re-creating the object with its old content.
	h = deleteHistory()
	h.Ops = append(h.Ops, Op{Client: 0, Role: RoleStale, Kind: KindWrite, Owner: "a", Token: 102, Guard: "chaos#0=102", Create: true,
		Call: at(200), Return: at(210), Outcome: Unknown, Counter: 1})
	h.Objects[4] = Event{Type: "ADDED", Version: 108, Seen: at(208), Counter: 1, Token: 102, Writer: "a", Fence: 102, FenceLock: "chaos#0"}
	mustFind(t, Check(h, 10*time.Second), "accepted token 102 at version 108 after token 104")
}

// revokeHistory: a holds the lock; a revoker deletes its permit with
// foreground propagation; the controller removes the finalizer; b acquires.
func revokeHistory(deleted int64) History {
	return History{
		Grace: int64(time.Second),
		Ops: []Op{
			{Client: 0, Kind: KindAcquire, Owner: "a", TTL: 2, Call: at(0), Return: at(10), Outcome: Acquired, NewToken: 100, ExpiresAt: at(2005)},
			{Client: 2, Role: RoleRevoker, Kind: KindRevoke, Owner: "a", Token: 100, Propagation: "Foreground", Call: at(100), Return: at(110), Outcome: Released},
			{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(120), Return: at(130), Outcome: Contended},
			{Client: 0, Kind: KindRenew, Owner: "a", Token: 100, TTL: 2, Call: at(140), Return: at(150), Outcome: Lost},
			{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(deleted + 10), Return: at(deleted + 20), Outcome: Acquired, NewToken: 103, ExpiresAt: at(deleted + 2015)},
		},
		Permits: []Event{
			{Type: "ADDED", Version: 100, Seen: at(8), Owner: "a", AcquireTime: at(5), RenewTime: at(5), ExpireTime: at(2005)},
			{Type: "MODIFIED", Version: 101, Seen: at(108), Owner: "a", Deleting: true, AcquireTime: at(5), RenewTime: at(5), ExpireTime: at(2005)},
			{Type: "DELETED", Version: 102, Seen: at(deleted), Owner: "a", AcquireTime: at(5), RenewTime: at(5), ExpireTime: at(2005)},
			{Type: "ADDED", Version: 103, Seen: at(deleted + 18), Owner: "b", AcquireTime: at(deleted + 15), RenewTime: at(deleted + 15), ExpireTime: at(deleted + 2015)},
		},
	}
}

func TestARevokedPermitIsReleased(t *testing.T) {
	r := Check(revokeHistory(200), 10*time.Second)
	if len(r.Violations) != 0 || r.Linearized != "yes" || r.Handovers["release"] != 1 || r.Handovers["deleting"] != 1 {
		t.Fatalf("violations %q, linearized %s, handovers %v", r.Violations, r.Linearized, r.Handovers)
	}
	// Without the revoke, b's acquire came before a's lease could end.
	h := revokeHistory(200)
	h.Ops = append(h.Ops[:1:1], h.Ops[2:]...)
	if r := Check(h, 10*time.Second); r.Linearized != "no" {
		t.Fatalf("linearized %s", r.Linearized)
	}
}

func TestALockStuckUnacquirableIsFound(t *testing.T) {
	// The revoked permit lingers 5 s, and b is told contended at 4 s: more
	// than the TTL (2 s) and the grace (1 s) after the release.
	h := revokeHistory(5000)
	h.Ops = append(h.Ops, Op{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(4000), Return: at(4010), Outcome: Contended})
	sortOps(h.Ops)
	mustFind(t, Check(h, 10*time.Second), "available: a's lease ended at")
	// The same while kube-apiserver was down from 50 ms to 3.5 s: excused,
	// and counted (3892 ms from the start of the delete, seen at 108 ms).
	h.Outages = [][2]int64{{at(50), at(3500)}}
	if r := Check(h, 10*time.Second); len(r.Violations) != 0 || r.Excused != 1 || r.LongestExcused != int64(3892*time.Millisecond) {
		t.Fatalf("violations %q, excused %d (longest %s)", r.Violations, r.Excused, time.Duration(r.LongestExcused))
	}
	h.Outages = nil
	// A waiting acquire sent at 1.5 s, within the bound, but answered
	// contended at 4.5 s: its last try found the lock stuck.
	h.Ops = revokeHistory(5000).Ops
	h.Ops = append(h.Ops, Op{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Wait: 3, Call: at(1500), Return: at(4500), Outcome: Contended})
	sortOps(h.Ops)
	mustFind(t, Check(h, 10*time.Second), "available: a's lease ended at")
	// Refused at 3 s only: within the bound.
	h.Ops = revokeHistory(5000).Ops
	h.Ops = append(h.Ops, Op{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(3000), Return: at(3010), Outcome: Contended})
	sortOps(h.Ops)
	if r := Check(h, 10*time.Second); len(r.Violations) != 0 {
		t.Fatalf("violations %q", r.Violations)
	}
}

func TestHeldWithinTheGraceIsLinearizable(t *testing.T) {
	// a's lease ended at 2005 ms; the route answers held until the grace
	// (1 s) has passed as well.
	h := goodHistory()
	h.Ops = h.Ops[:1]
	h.Ops = append(h.Ops, Op{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(2500), Return: at(2510), Outcome: Held, HolderOwner: "a", HolderToken: 100, HolderExpires: at(2005)})
	if res, _ := checkLinearizable(h.Ops, bounds{grace: int64(time.Second)}, 10*time.Second); res != "Ok" {
		t.Fatalf("within the grace: %v", res)
	}
	if res, _ := checkLinearizable(h.Ops, bounds{grace: int64(100 * time.Millisecond)}, 10*time.Second); res != "Illegal" {
		t.Fatalf("past the grace: %v", res)
	}
}

func TestATakeoverBeforeTheLeaseEndedInRealTimeIsFound(t *testing.T) {
	// a's renew was sent at 60 ms and stamped by a replica 500 ms behind
	// (its lease ends at 1565 ms by that stamp, at 2060 ms or later in real
	// time); b's takeover, stamped by a replica 500 ms ahead at 1600 ms,
	// is after a's expireTime by the stamps, but was seen at 1110 ms.
	h := goodHistory()
	h.Skew = int64(500 * time.Millisecond)
	h.Ops = []Op{
		{Client: 0, Kind: KindAcquire, Owner: "a", TTL: 2, Call: at(0), Return: at(10), Outcome: Acquired, NewToken: 100, ExpiresAt: at(2005)},
		{Client: 0, Kind: KindRenew, Owner: "a", Token: 100, TTL: 2, Call: at(60), Return: at(70), Outcome: Renewed, NewToken: 102, ExpiresAt: at(1565)},
		{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(1100), Return: at(1112), Outcome: Acquired, NewToken: 103, ExpiresAt: at(3600)},
	}
	h.Permits = []Event{
		h.Permits[0],
		{Type: "MODIFIED", Version: 102, Seen: at(68), Owner: "a", AcquireTime: at(5), RenewTime: at(-435), ExpireTime: at(1565)},
		{Type: "MODIFIED", Version: 103, Seen: at(1110), Owner: "b", AcquireTime: at(1600), RenewTime: at(1600), ExpireTime: at(3600)},
	}
	h.Objects = nil
	r := Check(h, 10*time.Second)
	mustFind(t, r, "handover in real time: b's acquire (version 103) was seen at")
	// Seen after the real end: no violation.
	h.Ops[2].Call, h.Ops[2].Return = at(2100), at(2112)
	h.Permits[2].Seen = at(2110)
	if r := Check(h, 10*time.Second); len(r.Violations) != 0 {
		t.Fatalf("violations %q", r.Violations)
	}
}

func semAcquire(client int, owner string, slot int, call, expires int64, token uint64) Op {
	return Op{Client: client, Lock: Semaphore, Limit: SemaphoreLimit, Kind: KindAcquire, Owner: owner, TTL: 2, Slot: slot,
		Call: call, Return: call + int64(10*time.Millisecond), Outcome: Acquired, NewToken: token, ExpiresAt: expires}
}

func TestTheSemaphoreChecks(t *testing.T) {
	h := History{Grace: int64(time.Second)}
	for i, owner := range []string{"s0", "s1", "s2"} {
		h.Ops = append(h.Ops, semAcquire(i, owner, i, at(int64(i)*10), at(2005+int64(i)*10), uint64(100+i)))
		h.SemPermits = append(h.SemPermits, Event{Type: "ADDED", Version: uint64(100 + i), Slot: i, Seen: at(int64(i)*10 + 8), Owner: owner,
			AcquireTime: at(5 + int64(i)*10), RenewTime: at(5 + int64(i)*10), ExpireTime: at(2005 + int64(i)*10)})
	}
	// s0 releases; s3 acquires slot 0 after.
	h.Ops = append(h.Ops, Op{Client: 0, Lock: Semaphore, Kind: KindRelease, Owner: "s0", Slot: 0, Token: 100, Call: at(100), Return: at(110), Outcome: Released},
		semAcquire(3, "s3", 0, at(120), at(2125), 104))
	h.SemPermits = append(h.SemPermits,
		Event{Type: "DELETED", Version: 103, Slot: 0, Seen: at(108), Owner: "s0", AcquireTime: at(5), RenewTime: at(5), ExpireTime: at(2005)},
		Event{Type: "ADDED", Version: 104, Slot: 0, Seen: at(128), Owner: "s3", AcquireTime: at(125), RenewTime: at(125), ExpireTime: at(2125)})
	r := Check(h, 10*time.Second)
	if len(r.Violations) != 0 || r.MostHolders != 3 {
		t.Fatalf("violations %q, most holders %d", r.Violations, r.MostHolders)
	}

	// s0's release answer lost: the record's delete ends its lease.
	lost := h
	lost.Ops = append([]Op{}, h.Ops...)
	lost.Ops[3].Outcome, lost.Ops[3].Error = Unknown, "EOF"
	if r := Check(lost, 10*time.Second); len(r.Violations) != 0 || r.MostHolders != 3 {
		t.Fatalf("a release whose answer was lost: violations %q, most holders %d", r.Violations, r.MostHolders)
	}

	// s0's release answer lost, and s3's permit, created after the delete
	// was seen, stamped by a replica 400 ms behind: its acquireTime is
	// before the watch saw s0's delete. In a run of 2026-12-03 this was
	// reported as a fourth holder.
	skewed := History{Grace: int64(time.Second), Skew: int64(400 * time.Millisecond)}
	skewed.Ops = append(append([]Op{}, h.Ops[:3]...),
		Op{Client: 0, Lock: Semaphore, Kind: KindRelease, Owner: "s0", Slot: 0, Token: 100, Call: at(990), Return: at(1001), Outcome: Unknown, Error: "EOF"},
		semAcquire(3, "s3", 0, at(1000), at(2610), 104))
	skewed.SemPermits = append(append([]Event{}, h.SemPermits[:3]...),
		Event{Type: "DELETED", Version: 103, Slot: 0, Seen: at(1000), Owner: "s0", AcquireTime: at(5), RenewTime: at(5), ExpireTime: at(2005)},
		Event{Type: "ADDED", Version: 104, Slot: 0, Seen: at(1011), Owner: "s3", AcquireTime: at(610), RenewTime: at(610), ExpireTime: at(2610)})
	if r := Check(skewed, 10*time.Second); len(r.Violations) != 0 || r.MostHolders != 3 {
		t.Fatalf("a lease stamped on a clock behind, after a delete seen later: violations %q, most holders %d", r.Violations, r.MostHolders)
	}

	// A fourth holder, in a slot beyond the limit.
	four := h
	four.Ops = append(append([]Op{}, h.Ops...), semAcquire(4, "s4", 3, at(130), at(2135), 105))
	four.SemPermits = append(append([]Event{}, h.SemPermits...), Event{Type: "ADDED", Version: 105, Slot: 3, Seen: at(138), Owner: "s4",
		AcquireTime: at(135), RenewTime: at(135), ExpireTime: at(2135)})
	r = Check(four, 10*time.Second)
	mustFind(t, r, "4 holders of chaos-sem (limit 3)")
	mustFind(t, r, "is slot 3, beyond its limit 3 (1 such versions recorded)")

	// An owner answered two slots.
	two := h
	two.Ops = append(append([]Op{}, h.Ops...), Op{Client: 1, Lock: Semaphore, Kind: KindAcquire, Owner: "s1", TTL: 2, Slot: 2,
		Call: at(140), Return: at(150), Outcome: Already, NewToken: 102, ExpiresAt: at(2025)})
	mustFind(t, Check(two, 10*time.Second), "owner s1 was answered slot 1 and slot 2")

	// A slot taken over while its lease runs.
	early := h
	early.Ops = append(append([]Op{}, h.Ops...), semAcquire(4, "s4", 1, at(500), at(2505), 106))
	early.SemPermits = append(append([]Event{}, h.SemPermits...), Event{Type: "MODIFIED", Version: 106, Slot: 1, Seen: at(508), Owner: "s4",
		AcquireTime: at(505), RenewTime: at(505), ExpireTime: at(2505)})
	mustFind(t, Check(early, 10*time.Second), "semaphore slot 1: handover: s4 took over")
}

func TestAReleaseAnsweredLostMayHaveFreedTheLease(t *testing.T) {
	// a's release reached a replica 400 ms ahead just before its lease
	// ended: it deleted the permit and answered lost; b then acquired,
	// stamped by a replica behind, before a's expireTime.
	ops := []Op{
		{Client: 0, Kind: KindAcquire, Owner: "a", TTL: 2, Call: at(0), Return: at(10), Outcome: Acquired, NewToken: 100, ExpiresAt: at(2000)},
		{Client: 0, Kind: KindRelease, Owner: "a", Token: 100, Call: at(1650), Return: at(1700), Outcome: Lost},
		{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(1710), Return: at(1750), Outcome: Acquired, NewToken: 102, ExpiresAt: at(3320)},
	}
	if res, _ := checkLinearizable(ops, bounds{grace: int64(time.Second), skew: int64(400 * time.Millisecond)}, 10*time.Second); res != "Ok" {
		t.Fatalf("result %v", res)
	}
	// Without the skew the release could not have found the lease ended.
	if res, _ := checkLinearizable(ops, bounds{grace: int64(time.Second)}, 10*time.Second); res != "Illegal" {
		t.Fatalf("without skew: %v", res)
	}
}

// podGoneHistory: a holds the lock from a pod whose delete is sent at
// 100 ms; the expiry controller deletes a's permit (seen at 150 ms), and b
// acquires at 200 ms, long before a's lease would have ended.
func podGoneHistory() History {
	return History{
		Grace:    int64(time.Second),
		PodsGone: []PodGone{{Client: 0, UID: "pod-a", Call: at(100)}},
		Ops: []Op{
			{Client: 0, Kind: KindAcquire, Owner: "a", TTL: 2, Call: at(0), Return: at(10), Outcome: Acquired, NewToken: 100, ExpiresAt: at(2005)},
			{Client: 0, Kind: KindRenew, Owner: "a", Token: 100, TTL: 2, Call: at(160), Return: at(170), Outcome: Lost},
			{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(190), Return: at(210), Outcome: Acquired, NewToken: 102, ExpiresAt: at(2205)},
		},
		Permits: []Event{
			{Type: "ADDED", Version: 100, Seen: at(8), Owner: "a", HolderPod: "pod-a", AcquireTime: at(5), RenewTime: at(5), ExpireTime: at(2005)},
			{Type: "DELETED", Version: 101, Seen: at(150), Owner: "a", HolderPod: "pod-a", AcquireTime: at(5), RenewTime: at(5), ExpireTime: at(2005)},
			{Type: "ADDED", Version: 102, Seen: at(208), Owner: "b", AcquireTime: at(205), RenewTime: at(205), ExpireTime: at(2205)},
		},
	}
}

func TestAPermitOfADeletedPodMayBeFreed(t *testing.T) {
	r := Check(podGoneHistory(), 10*time.Second)
	if len(r.Violations) != 0 || r.Linearized != "yes" || r.Handovers["pod-gone"] != 1 {
		t.Fatalf("violations %q, linearized %s, handovers %v", r.Violations, r.Linearized, r.Handovers)
	}
	// The same delete with no pod deleted: an early handover.
	h := podGoneHistory()
	h.PodsGone = nil
	mustFind(t, Check(h, 10*time.Second), "handover: b acquired")
	// A pod deleted after the permit went does not excuse it.
	h = podGoneHistory()
	h.PodsGone[0].Call = at(155)
	mustFind(t, Check(h, 10*time.Second), "handover: b acquired")
	// Nor does another pod's delete: the permit names pod-a.
	h = podGoneHistory()
	h.PodsGone[0].UID = "pod-b"
	mustFind(t, Check(h, 10*time.Second), "handover: b acquired")
	// A release of a that raced the controller and won: still one lease at
	// a time, whichever delete it was.
	h = podGoneHistory()
	h.Ops = append(h.Ops, Op{Client: 0, Kind: KindRelease, Owner: "a", Token: 100, Call: at(120), Return: at(155), Outcome: Released})
	sortOps(h.Ops)
	if r := Check(h, 10*time.Second); len(r.Violations) != 0 || r.Linearized != "yes" {
		t.Fatalf("with a release that won: violations %q, linearized %s", r.Violations, r.Linearized)
	}
}

// b's acquire raises the ConfigMap's record before it answers: a version
// with a's data and b's token as its record is the manager's raise, not a
// write of a's, and passes; a version that lowers the record, or changes
// the data under a token other than its record, is still found.
func TestAnAcquiresRaiseIsNoHoldersWrite(t *testing.T) {
	h := goodHistory()
	raise := Event{Type: "MODIFIED", Version: 106, Seen: at(109), Counter: 1, Token: 100, Writer: "a", Fence: 104, FenceLock: "chaos#0"}
	h.Objects = []Event{h.Objects[0], raise, h.Objects[1]}
	h.Objects[2].Version = 107
	h.Ops[6].Version = 107
	r := Check(h, 10*time.Second)
	if len(r.Violations) != 0 || r.Raises != 1 || r.Accepted != 2 {
		t.Fatalf("violations %q, raises %d, accepted %d", r.Violations, r.Raises, r.Accepted)
	}
	forged := goodHistory()
	forged.Objects = []Event{forged.Objects[0], {Type: "MODIFIED", Version: 103, Seen: at(95), Counter: 3, Token: 100, Writer: "a", Fence: 104, FenceLock: "chaos#0"}}
	mustFind(t, Check(forged, 10*time.Second), "was written under token 100 but records fence 104")
	setup := goodHistory()
	setup.Objects = append([]Event{{Type: "MODIFIED", Version: 99, Seen: at(9), Token: 90, Writer: "setup", Fence: 100, FenceLock: "chaos#0"}}, setup.Objects...)
	if r := Check(setup, 10*time.Second); len(r.Violations) != 0 || r.Raises != 1 {
		t.Fatalf("a raise of the setup's write: violations %q, raises %d", r.Violations, r.Raises)
	}
}

// A held answer that names no holder is the line's (waiters were ahead):
// it claims nothing of the lease, even when the lease had ended. One that
// names a holder past its end and the grace is still a violation.
func TestHeldBehindTheLineClaimsNothingOfTheLease(t *testing.T) {
	h := goodHistory()
	h.Grace = int64(time.Second)
	h.Ops = append(h.Ops, Op{Client: 2, Kind: KindAcquire, Owner: "c", TTL: 2, Wait: 3, Call: at(5000), Return: at(8000), Outcome: Held})
	sortOps(h.Ops)
	if r := Check(h, time.Minute); r.Linearized != "yes" {
		t.Fatalf("a held answer behind the line: linearizable %s, violations %q", r.Linearized, r.Violations)
	}
	h = goodHistory()
	h.Grace = int64(time.Second)
	h.Ops = append(h.Ops, Op{Client: 2, Kind: KindAcquire, Owner: "c", TTL: 2, Call: at(5000), Return: at(5010), Outcome: Held, HolderOwner: "b", HolderToken: 104, HolderExpires: at(2105)})
	sortOps(h.Ops)
	if r := Check(h, time.Minute); r.Linearized != "no" {
		t.Fatalf("held by a holder long past its end: linearizable %s", r.Linearized)
	}
}
