package chaos

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
			{Client: 0, Kind: KindWrite, Owner: "a", Token: 100, Call: at(40), Return: at(50), Outcome: Written, Counter: 1, Version: 101},
			{Client: 0, Kind: KindRenew, Owner: "a", Token: 100, TTL: 2, Call: at(60), Return: at(70), Outcome: Renewed, NewToken: 102, ExpiresAt: at(2065)},
			{Client: 0, Kind: KindRelease, Owner: "a", Token: 102, Call: at(80), Return: at(90), Outcome: Released},
			{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(100), Return: at(110), Outcome: Acquired, NewToken: 104, ExpiresAt: at(2105)},
			{Client: 1, Kind: KindWrite, Owner: "b", Token: 104, Call: at(120), Return: at(130), Outcome: Written, Counter: 2, Version: 105},
		},
		Permits: []Event{
			{Type: "ADDED", Version: 100, Seen: at(8), Owner: "a", AcquireTime: at(5), RenewTime: at(5), ExpireTime: at(2005)},
			{Type: "MODIFIED", Version: 102, Seen: at(68), Owner: "a", AcquireTime: at(5), RenewTime: at(65), ExpireTime: at(2065)},
			{Type: "DELETED", Version: 103, Seen: at(88), Owner: "a", AcquireTime: at(5), RenewTime: at(65), ExpireTime: at(2065)},
			{Type: "ADDED", Version: 104, Seen: at(108), Owner: "b", AcquireTime: at(105), RenewTime: at(105), ExpireTime: at(2105)},
		},
		Objects: []Event{
			{Type: "ADDED", Version: 99, Seen: at(0)},
			{Type: "MODIFIED", Version: 101, Seen: at(48), Counter: 1, Token: 100, Writer: "a", Fence: 100},
			{Type: "MODIFIED", Version: 105, Seen: at(128), Counter: 2, Token: 104, Writer: "b", Fence: 104},
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
	h.Ops = append(h.Ops, Op{Client: 0, Kind: KindWrite, Owner: "a", Token: 102, Call: at(140), Return: at(150), Outcome: Written, Counter: 3, Version: 106})
	h.Objects = append(h.Objects, Event{Type: "MODIFIED", Version: 106, Seen: at(148), Counter: 3, Token: 102, Writer: "a", Fence: 102})
	r := Check(h, 10*time.Second)
	mustFind(t, r, "accepted token 102 at version 106 after token 104")
	mustFind(t, r, "after the permit had moved on to version 103")
}

func TestWriteUnderReplacedTokenIsFound(t *testing.T) {
	// The permit was released (version 103, seen at 88 ms); a write under
	// token 102 sent at 95 ms must not be stored, even before b writes.
	h := goodHistory()
	h.Ops = append(h.Ops[:6], Op{Client: 0, Kind: KindWrite, Owner: "a", Token: 102, Call: at(95), Return: at(99), Outcome: Written, Counter: 2, Version: 106})
	h.Objects = append(h.Objects[:2], Event{Type: "MODIFIED", Version: 106, Seen: at(98), Counter: 2, Token: 102, Writer: "a", Fence: 102})
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
	h.Objects[2].Seen = at(2208)
	mustFind(t, Check(h, 10*time.Second), "after that lease ended")
}

func TestWriteInTheWindowIsCountedNotFlagged(t *testing.T) {
	// Sent at 85 ms, before the release was seen (88 ms), committed after it.
	h := goodHistory()
	h.Ops = append(h.Ops[:6], Op{Client: 0, Kind: KindWrite, Owner: "a", Token: 102, Call: at(85), Return: at(99), Outcome: Unknown, Counter: 2})
	h.Objects = append(h.Objects[:2], Event{Type: "MODIFIED", Version: 106, Seen: at(98), Counter: 2, Token: 102, Writer: "a", Fence: 102})
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
	h.Objects = h.Objects[:2]
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
	h.Objects = h.Objects[:2]                         // and b's write
	r := Check(h, 10*time.Second)
	mustFind(t, r, "no delete of a's permit")
	mustFind(t, r, "the ConfigMap has no such version")
}

func TestTwoHoldersAtOnceAreNotLinearizable(t *testing.T) {
	h := goodHistory()
	// b is told it acquired while a holds a live lease.
	h.Ops[1] = Op{Client: 1, Kind: KindAcquire, Owner: "b", TTL: 2, Call: at(20), Return: at(30), Outcome: Acquired, NewToken: 101, ExpiresAt: at(2025)}
	res, _ := checkLinearizable(h.Ops, 10*time.Second)
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
	if res, _ := checkLinearizable(ops, 10*time.Second); res != "Ok" {
		t.Fatalf("with c's acquire applied: %v", res)
	}
	// Without c's acquire the held answer has no cause.
	if res, _ := checkLinearizable(append(ops[:5:5], ops[6]), 10*time.Second); res != "Illegal" {
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
	if res, _ := checkLinearizable(ops, 10*time.Second); res != "Illegal" {
		t.Fatalf("result %v", res)
	}
	// After a's lease has ended, b may take it.
	ops[2].Call, ops[2].Return, ops[2].ExpiresAt = at(2300), at(2310), at(4305)
	if res, _ := checkLinearizable(ops, 10*time.Second); res != "Ok" {
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
