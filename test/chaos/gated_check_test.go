package main

import (
	"strings"
	"testing"
	"time"

	"github.com/queen-locks/queen-locks/permit"
)

// year is a gated pod's permit's lifetime: the longest TTL, as the line
// asks for a pod without a ttl annotation.
const year = permit.MaxTTLSeconds * int64(time.Second)

// gatedHistory is goodHistory, then: b releases; gated pod g (UID u1)
// is let in (its permit, version 107, seen at 158 ms; its client sees the
// gate lifted at 170 ms); c, refused while g holds, is told g holds it;
// g's client ends it at 400 ms and the manager frees its permit (seen at
// 420 ms); c acquires after.
func gatedHistory() History {
	h := goodHistory()
	h.Ops = append(h.Ops,
		Op{Client: 1, Kind: KindRelease, Owner: "b", Token: 104, Call: at(140), Return: at(150), Outcome: Released},
		Op{Client: 2, Kind: KindAcquire, Owner: "c", TTL: 2, Call: at(200), Return: at(210), Outcome: Held, HolderOwner: "pod:u1", HolderToken: 107, HolderExpires: at(155) + year},
		Op{Client: 9, Role: RoleGated, Kind: KindPodFinish, Owner: "g9-1", Call: at(401), Return: at(410), Outcome: Finished},
		Op{Client: 2, Kind: KindAcquire, Owner: "c", TTL: 2, Call: at(430), Return: at(440), Outcome: Acquired, NewToken: 109, ExpiresAt: at(2435)},
	)
	h.Permits = append(h.Permits,
		Event{Type: "DELETED", Version: 106, Seen: at(148), Owner: "b", AcquireTime: at(105), RenewTime: at(105), ExpireTime: at(2105)},
		Event{Type: "ADDED", Version: 107, Seen: at(158), Owner: "pod:u1", HolderPod: "u1", AcquireTime: at(155), RenewTime: at(155), ExpireTime: at(155) + year},
		Event{Type: "DELETED", Version: 108, Seen: at(420), Owner: "pod:u1", HolderPod: "u1", AcquireTime: at(155), RenewTime: at(155), ExpireTime: at(155) + year},
		Event{Type: "ADDED", Version: 109, Seen: at(438), Owner: "c", AcquireTime: at(435), RenewTime: at(435), ExpireTime: at(2435)},
	)
	h.Holds = []Hold{{Client: 9, Pod: "g9-1", UID: "u1", Lock: Lock, Slot: 0, Token: 107, Start: at(170), End: at(400), How: EndSucceeded}}
	return h
}

func TestGatedPodsHoldBetweenRouteHolders(t *testing.T) {
	r := Check(gatedHistory(), 10*time.Second)
	if len(r.Violations) != 0 || r.Linearized != "yes" {
		t.Fatalf("violations %q, linearized %s", r.Violations, r.Linearized)
	}
	g := r.Gated
	if g.Holds != 1 || g.ByLock[Lock] != 1 || g.Permits != 1 || g.Most[Lock] != 1 || g.Empty != 0 {
		t.Fatalf("figures %+v", g)
	}
	if r.Handovers["gated pod ended"] != 1 || r.Handovers["release"] != 2 {
		t.Fatalf("handovers %v", r.Handovers)
	}
	// The clients' own operations are counted, not the ones made from the
	// record, and the gated client is not a misbehaving one.
	if r.Ops[KindAcquire+"/"+Acquired] != 3 || r.Ops[KindPodFinish+"/"+Finished] != 1 || len(r.Misbehaving) != 0 {
		t.Fatalf("ops %v, misbehaving %v", r.Ops, r.Misbehaving)
	}
}

func TestGatedPodsAreHoldersToTheLinearizabilityCheck(t *testing.T) {
	// Without the gated pod's permit taken into account, c's held answer
	// naming it has no cause: the record's acquire and end of it do.
	ops := gatedHistory().Ops
	if res, _ := checkLinearizable(ops, bounds{}, 10*time.Second); res != "Illegal" {
		t.Fatalf("without the gated pod's operations: %v", res)
	}
	h := gatedHistory()
	made := gatedOps(h)
	if len(made) != 2 || made[0].Kind != KindAcquire || made[0].NewToken != 107 || made[0].Call != at(155) || made[0].Return != at(158) ||
		made[1].Kind != KindRevoke || made[1].Token != 107 || made[1].Call != at(400) || made[1].Return != at(420) {
		t.Fatalf("made from the record: %v", made)
	}
	ops = append(ops, made...)
	sortOps(ops)
	if res, _ := checkLinearizable(ops, bounds{}, 10*time.Second); res != "Ok" {
		t.Fatalf("with them: %v", res)
	}
	// c told it acquired while the pod still ran (before its end was
	// sent) fits no order: the pod's permit ends no earlier than that.
	h.Ops[len(h.Ops)-1].Call, h.Ops[len(h.Ops)-1].Return = at(380), at(390)
	r := Check(h, 10*time.Second)
	if r.Linearized != "no" {
		t.Fatalf("c acquired before the pod ended: linearized %s", r.Linearized)
	}
}

func TestAGatedPodsPermitFreedBeforeItEndedIsFound(t *testing.T) {
	h := gatedHistory()
	// The manager freed the permit at 300 ms while the pod ran to 400 ms,
	// and c got the lock at 310 ms.
	h.Permits[6].Seen = at(300)
	h.Permits[7].Seen, h.Permits[7].AcquireTime, h.Permits[7].RenewTime, h.Permits[7].ExpireTime = at(318), at(315), at(315), at(2315)
	c := &h.Ops[len(h.Ops)-1]
	c.Call, c.Return, c.ExpiresAt = at(310), at(320), at(2315)
	r := Check(h, 10*time.Second)
	mustFind(t, r, "gated: the permit of gated pod g9-1 (owner pod:u1) of chaos slot 0 token 107")
	mustFind(t, r, "before the pod ended at")
	mustFind(t, r, "gated: 2 holders of chaos (limit 1)")
}

func TestAGatedPodsPermitRevokedByHandIsNoViolation(t *testing.T) {
	h := gatedHistory()
	// Someone deleted the pod's permit with kubectl at 250 ms; c acquired
	// at 300 ms, while the pod, never told, still ran.
	h.Ops = append(h.Ops, Op{Client: 5, Role: RoleRevoker, Kind: KindRevoke, Owner: "pod:u1", Token: 107, Propagation: "Background",
		Call: at(250), Return: at(262), Outcome: Released})
	h.Permits[6].Seen = at(260)
	h.Permits[7].Seen, h.Permits[7].AcquireTime, h.Permits[7].RenewTime, h.Permits[7].ExpireTime = at(308), at(305), at(305), at(2305)
	c := &h.Ops[len(h.Ops)-2]
	c.Call, c.Return, c.ExpiresAt = at(300), at(310), at(2305)
	sortOps(h.Ops)
	r := Check(h, 10*time.Second)
	if len(r.Violations) != 0 || r.Linearized != "yes" {
		t.Fatalf("violations %q, linearized %s", r.Violations, r.Linearized)
	}
	if r.Handovers["release"] != 3 || r.Handovers["gated pod ended"] != 0 {
		t.Fatalf("handovers %v", r.Handovers)
	}
}

func TestAGatedPodDeletedWhileItLookedGatedHeldNothing(t *testing.T) {
	h := gatedHistory()
	// The client chose to delete the pod at 160 ms, before its watch
	// showed it let in (at 170 ms): the hold is empty, and c may acquire
	// as soon as the permit is freed.
	h.Holds[0].End, h.Holds[0].How = at(160), EndDeleted
	h.Ops[len(h.Ops)-2] = Op{Client: 9, Role: RoleGated, Kind: KindPodDelete, Owner: "g9-1", Call: at(161), Return: at(175), Outcome: Deleted}
	h.Permits[6].Seen = at(180)
	h.Permits[7].Seen, h.Permits[7].AcquireTime, h.Permits[7].RenewTime, h.Permits[7].ExpireTime = at(198), at(195), at(195), at(2195)
	c := &h.Ops[len(h.Ops)-1]
	c.Call, c.Return, c.ExpiresAt = at(190), at(200), at(2195)
	h.Ops[len(h.Ops)-3].Call, h.Ops[len(h.Ops)-3].Return = at(165), at(170) // c was refused while the pod's permit lived
	sortOps(h.Ops)
	r := Check(h, 10*time.Second)
	if len(r.Violations) != 0 || r.Linearized != "yes" || r.Gated.Empty != 1 {
		t.Fatalf("violations %q, linearized %s, figures %+v", r.Violations, r.Linearized, r.Gated)
	}
}

func TestAGatedPodWithoutItsTokenIsFound(t *testing.T) {
	h := gatedHistory()
	h.Holds[0].Token = 0
	mustFind(t, Check(h, 10*time.Second), "was let in without a token")

	h = gatedHistory()
	h.Holds[0].Token = 104 // b's
	mustFind(t, Check(h, 10*time.Second), "carries token 104, but that version of chaos is ADDED of owner b")
}

// gatedSemaphore: three route holders of the semaphore, one per slot,
// from 5 ms to their release at 500 ms; a gated pod is let into slot 1
// after s1's release (its permit seen at 520 ms), holds 530..900 ms.
func gatedSemaphore() History {
	h := History{Grace: int64(time.Second)}
	for i, owner := range []string{"s0", "s1", "s2"} {
		h.Ops = append(h.Ops, semAcquire(i, owner, i, at(int64(i)), at(2005+int64(i)), uint64(100+i)),
			Op{Client: i, Lock: Semaphore, Kind: KindRelease, Owner: owner, Slot: i, Token: uint64(100 + i), Call: at(500), Return: at(510), Outcome: Released})
		h.SemPermits = append(h.SemPermits, Event{Type: "ADDED", Version: uint64(100 + i), Slot: i, Seen: at(int64(i) + 8), Owner: owner,
			AcquireTime: at(5 + int64(i)), RenewTime: at(5 + int64(i)), ExpireTime: at(2005 + int64(i))})
	}
	h.SemPermits = append(h.SemPermits,
		Event{Type: "DELETED", Version: 110, Slot: 1, Seen: at(505), Owner: "s1", AcquireTime: at(6), RenewTime: at(6), ExpireTime: at(2006)},
		Event{Type: "ADDED", Version: 111, Slot: 1, Seen: at(520), Owner: "pod:u2", HolderPod: "u2", AcquireTime: at(515), RenewTime: at(515), ExpireTime: at(515) + year},
		Event{Type: "DELETED", Version: 112, Slot: 1, Seen: at(950), Owner: "pod:u2", HolderPod: "u2", AcquireTime: at(515), RenewTime: at(515), ExpireTime: at(515) + year},
	)
	h.Holds = []Hold{{Client: 9, Pod: "g9-2", UID: "u2", Lock: Semaphore, Slot: 1, Token: 111, Start: at(530), End: at(900), How: EndDeleted}}
	sortOps(h.Ops)
	return h
}

func TestGatedPodsShareTheSemaphoresLimit(t *testing.T) {
	r := Check(gatedSemaphore(), 10*time.Second)
	if len(r.Violations) != 0 || r.Gated.Most[Semaphore] != 3 || r.Gated.ByLock[Semaphore] != 1 {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Gated)
	}

	// The pod let in while s1 still held slot 1 (the holds overlap;
	// the record says the same, and is judged by its own checks too).
	h := gatedSemaphore()
	h.Holds[0].Start = at(400)
	r = Check(h, 10*time.Second)
	mustFind(t, r, "gated: 4 holders of chaos-sem (limit 3)")
	mustFind(t, r, "gated: chaos-sem slot 1 had two holders at once")

	// A route holder's lease in slot 1 after the pod's, which began
	// before the pod ended: the pod's permit freed early.
	h = gatedSemaphore()
	h.Ops = append(h.Ops, semAcquire(3, "s3", 1, at(800), at(2805), 113))
	h.SemPermits[5].Seen = at(790)
	h.SemPermits = append(h.SemPermits, Event{Type: "ADDED", Version: 113, Slot: 1, Seen: at(808), Owner: "s3", AcquireTime: at(805), RenewTime: at(805), ExpireTime: at(2805)})
	r = Check(h, 10*time.Second)
	mustFind(t, r, "gated: the permit of gated pod g9-2")
	mustFind(t, r, "gated: chaos-sem slot 1 had two holders at once")
}

func TestTokensGoUpInEachSlot(t *testing.T) {
	// A route lease of slot 0 renewed (token 300) after a gated pod was
	// given token 200 of that slot: the spans interleave by token.
	var r Report
	r.Gated.Most = map[string]int{}
	r.checkSpans(gatedLock{name: Semaphore, limit: 3}, []span{
		{who: "s0", slot: 0, start: at(0), end: at(100), first: 100, last: 300},
		{who: "g", gated: true, slot: 0, start: at(200), end: at(300), first: 200, last: 200},
	})
	if len(r.Violations) != 1 || !strings.Contains(r.Violations[0], "tokens of chaos-sem slot 0 do not go up") {
		t.Fatalf("violations %q", r.Violations)
	}
	// Route holders among themselves are left to the semaphore's checks.
	r = Report{Gated: GatedFigures{Most: map[string]int{}}}
	r.checkSpans(gatedLock{name: Semaphore, limit: 3}, []span{
		{who: "s0", slot: 0, start: at(0), end: at(100), first: 100, last: 300},
		{who: "s1", slot: 0, start: at(200), end: at(300), first: 200, last: 200},
	})
	if len(r.Violations) != 0 {
		t.Fatalf("violations %q", r.Violations)
	}
}

func TestHoldLinesAreToldFromOps(t *testing.T) {
	if _, ok := holdOf([]byte(`{"client":1,"kind":"acquire","owner":"c1.1","call":1,"return":2,"outcome":"acquired"}`)); ok {
		t.Fatal("an op was read as a hold")
	}
	x, ok := holdOf([]byte(`{"hold":{"client":13,"pod":"g13-2","uid":"u","lock":"chaos-sem","slot":1,"token":357,"start":1,"end":2,"how":"deleted"}}`))
	if !ok || x.Token != 357 || x.Lock != Semaphore || x.How != EndDeleted {
		t.Fatalf("hold %+v, %t", x, ok)
	}
}
