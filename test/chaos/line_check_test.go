package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// lineHistory: x holds chaos and releases (version 20); waiters a (place
// 11) and b (place 12) joined while x held it; a takes the slot (22),
// releases; b takes it (26). The manager's Lease is renewed every 2 s
// throughout.
func lineHistory() History {
	lease := func(h History) History {
		for t := int64(0); t <= 12000; t += 2000 {
			h.Leases = append(h.Leases, LeaseEvent{Version: uint64(1000 + t), Seen: at(t), Holder: "r0"})
		}
		return h
	}
	p := func(typ string, v uint64, seen int64, owner string) Event {
		return Event{Type: typ, Version: v, Seen: at(seen), Owner: owner, AcquireTime: at(seen - 2), RenewTime: at(seen - 2), ExpireTime: at(seen + 10000)}
	}
	return lease(History{
		Grace: int64(time.Second), Skew: int64(400 * time.Millisecond),
		Ops: []Op{
			{Client: 0, Kind: KindAcquire, Owner: "x", TTL: 10, Call: at(0), Return: at(10), Outcome: Acquired, NewToken: 10},
			{Client: 1, Kind: KindAcquire, Owner: "a", TTL: 10, Wait: 3, Call: at(90), Return: at(510), Outcome: Acquired, NewToken: 22},
			{Client: 2, Kind: KindAcquire, Owner: "b", TTL: 10, Wait: 3, Call: at(95), Return: at(900), Outcome: Acquired, NewToken: 26},
		},
		Permits: []Event{
			p("ADDED", 10, 5, "x"), p("DELETED", 20, 500, "x"),
			p("ADDED", 22, 505, "a"), p("DELETED", 25, 800, "a"),
			p("ADDED", 26, 805, "b"),
		},
		Waiters: []WaiterEvent{
			{Type: "ADDED", Version: 11, Seen: at(100), UID: "wa", Lock: Lock, Owner: "a", Limit: 1},
			{Type: "ADDED", Version: 12, Seen: at(101), UID: "wb", Lock: Lock, Owner: "b", Limit: 1},
			{Type: "MODIFIED", Version: 15, Seen: at(300), UID: "wa", Lock: Lock, Owner: "a", Limit: 1, Position: 11},
			{Type: "DELETED", Version: 23, Seen: at(506), UID: "wa", Lock: Lock, Owner: "a", Limit: 1, Position: 11},
			{Type: "DELETED", Version: 27, Seen: at(806), UID: "wb", Lock: Lock, Owner: "b", Limit: 1},
		},
	})
}

func TestTheLineServedInOrderPasses(t *testing.T) {
	var r Report
	r.checkLine(lineHistory())
	if len(r.Violations) != 0 || r.Line.Passes != 0 || r.Line.Leases != 1 || r.Line.FromLine != 1 || r.Line.Waiters != 2 || r.Line.Positions != 1 {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
}

func TestAWaiterServedOutOfLineIsFound(t *testing.T) {
	h := lineHistory()
	// b takes the slot x freed while a, ahead of it, still waits.
	h.Permits[2].Owner, h.Permits[3].Owner, h.Permits[4].Owner = "b", "b", "a"
	var r Report
	r.checkLine(h)
	if r.Line.Unexcused != 1 || len(r.Violations) != 1 || !strings.Contains(r.Violations[0], "went to b at version 22") || !strings.Contains(r.Violations[0], "passing waiter of a (place 11") {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
}

func TestAWrongPositionIsFound(t *testing.T) {
	h := lineHistory()
	h.Waiters[2].Position = 9
	var r Report
	r.checkLine(h)
	if len(r.Violations) == 0 || !strings.Contains(r.Violations[0], "spec.position") {
		t.Fatalf("violations %q", r.Violations)
	}
}

// gapHistory: c's plain acquire creates the slot x freed before a, the
// first waiter, does.
func gapHistory() History {
	h := lineHistory()
	h.Ops = append(h.Ops, Op{Client: 3, Kind: KindAcquire, Owner: "c", TTL: 10, Call: at(300), Return: at(510), Outcome: Acquired, NewToken: 21})
	sortOps(h.Ops)
	// c's lease is created at 21 and released at 24; a's and b's, and
	// their waiters' deletes, come 10 versions later than in lineHistory.
	h.Permits = append(h.Permits[:2:2], Event{Type: "ADDED", Version: 21, Seen: at(502), Owner: "c", AcquireTime: at(501), RenewTime: at(501), ExpireTime: at(10501)})
	rest := lineHistory().Permits[2:]
	for i := range rest {
		rest[i].Version += 10
	}
	h.Permits = append(h.Permits, Event{Type: "DELETED", Version: 24, Seen: at(504), Owner: "c", AcquireTime: at(501), RenewTime: at(501), ExpireTime: at(10501)})
	h.Permits = append(h.Permits, rest...)
	for i := range h.Waiters {
		if h.Waiters[i].Type == "DELETED" {
			h.Waiters[i].Version += 10
		}
	}
	return h
}

func TestAPlainCreateInTheGapIsExcusedByItsRuleAlone(t *testing.T) {
	var r Report
	r.checkLine(gapHistory())
	if len(r.Violations) != 0 || r.Line.Passes != 2 || r.Line.Excused[RuleGap] != 2 || r.Line.LongestGap != int64(2*time.Millisecond) {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
	// Without the rule (the permit handed over in place), the same
	// history passes a and b.
	saved := lineRules
	defer func() { lineRules = saved }()
	lineRules = slices.DeleteFunc(slices.Clone(lineRules), func(s string) bool { return s == RuleGap })
	r = Report{}
	r.checkLine(gapHistory())
	if r.Line.Unexcused != 2 || len(r.Violations) != 2 {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
}

func TestAPlainTakeoverPassesNobodyAlreadyWaiting(t *testing.T) {
	// c takes x's expired permit over (no delete between) while a and b
	// wait: they were waiting when c's acquire was sent.
	h := gapHistory()
	h.Permits = slices.Delete(h.Permits, 1, 2) // x's delete
	h.Permits[1].Type = "MODIFIED"
	var r Report
	r.checkLine(h)
	if r.Line.Unexcused != 2 {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
	// Sent before they joined, it passes nobody already waiting.
	h.Ops[1].Call = at(50) // c's acquire, sorted first
	for i := range h.Ops {
		if h.Ops[i].Owner == "c" {
			h.Ops[i].Call = at(50)
		}
	}
	r = Report{}
	r.checkLine(h)
	if len(r.Violations) != 0 || r.Line.Excused[RuleJoinedDuring] != 2 {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
}

// gatedLine: pods p (place 11) and q (place 12) of chaos wait; x releases
// at 500 ms; one of them takes the slot.
func gatedLine(first string, pQueued, qQueued int64) History {
	h := lineHistory()
	h.Ops = h.Ops[:1]
	h.Waiters = []WaiterEvent{
		{Type: "ADDED", Version: 11, Seen: at(100), UID: "wp", Lock: Lock, Owner: "pod:p", Limit: 1, Pod: "p"},
		{Type: "ADDED", Version: 12, Seen: at(101), UID: "wq", Lock: Lock, Owner: "pod:q", Limit: 1, Pod: "q"},
	}
	h.Pods = []PodInfo{{UID: "p", Name: "g1-1", Lock: Lock, Limit: 1, QueuedAt: at(pQueued)}, {UID: "q", Name: "g1-2", Lock: Lock, Limit: 1, QueuedAt: at(qQueued)}}
	h.Permits = h.Permits[:2]
	h.Permits = append(h.Permits, Event{Type: "ADDED", Version: 22, Seen: at(505), Owner: "pod:" + first, AcquireTime: at(503), RenewTime: at(503), ExpireTime: at(1e6)})
	return h
}

func TestGatedPodsGoByQueuedAt(t *testing.T) {
	// q, queued first, goes first though its waiter's place is later.
	var r Report
	r.checkLine(gatedLine("q", 90, 80))
	if len(r.Violations) != 0 || r.Line.Passes != 0 {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
	// q, queued 5 s after p, goes first: p is passed.
	r = Report{}
	r.checkLine(gatedLine("q", -5000, 80))
	if r.Line.Unexcused != 1 || !strings.Contains(r.Violations[0], "went to pod:q") {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
	// Queued less than twice the skew apart: either order.
	r = Report{}
	r.checkLine(gatedLine("q", -700, 80))
	if len(r.Violations) != 0 || r.Line.Excused[RuleQueuedAt] != 1 {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
	// A pod told it cannot be let in is passed over.
	h := gatedLine("q", -5000, 80)
	h.Pods[0].NotAdmitted = at(400)
	r = Report{}
	r.checkLine(h)
	if len(r.Violations) != 0 || r.Line.Excused[RuleNotAdmitted] != 1 {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
}

func TestAGatedPodPassingARouteWaiterIsFound(t *testing.T) {
	h := gatedLine("q", 90, 80)
	h.Waiters[0].Pod, h.Waiters[0].Owner = "", "a"
	var r Report
	r.checkLine(h)
	if r.Line.Unexcused != 1 || !strings.Contains(r.Violations[0], "passing waiter of a") {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
}

// stuckHistory: x releases chaos at 500 ms; gated pod p, alone in the
// line, is let in only at 30 s, while the Lease is renewed every 2 s.
func stuckHistory() History {
	h := gatedLine("p", 0, 0)
	h.Waiters = h.Waiters[:1]
	h.Pods = h.Pods[:1]
	h.Permits[2].Seen = at(30000)
	h.Leases = nil
	for t := int64(0); t <= 31000; t += 2000 {
		h.Leases = append(h.Leases, LeaseEvent{Version: uint64(1000 + t), Seen: at(t), Holder: "r0"})
	}
	return h
}

func TestAGatedPodThatCouldBeLetInAndWasNotIsFound(t *testing.T) {
	var r Report
	r.checkLine(stuckHistory())
	if len(r.Violations) != 1 || !strings.Contains(r.Violations[0], "stayed free from") || !strings.Contains(r.Violations[0], "pod g1-1") {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
}

func TestTimeWithoutALeaderOrControlPlaneIsNotCounted(t *testing.T) {
	// The leader stops renewing from 2 s to 22 s (a leader change), and
	// the API server is down from 24 s to 29 s: 2.5 s and 1 s count.
	h := stuckHistory()
	h.Leases = slices.DeleteFunc(h.Leases, func(e LeaseEvent) bool { return e.Seen > at(2000) && e.Seen < at(22000) })
	h.Leases[2].Holder = "r1"
	h.Outages = [][2]int64{{at(24000), at(29000)}}
	var r Report
	r.checkLine(h)
	if len(r.Violations) != 0 || r.Line.LongestHead > int64(admitWithin) || r.Line.LongestHead == 0 {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
}

func TestAPodThatCannotBeLetInHoldsNobodyBack(t *testing.T) {
	// p cannot be let in, and is told so at 1 s; q behind it is let in at
	// 30 s: q headed the free slot from 1 s.
	h := stuckHistory()
	h.Waiters = append(h.Waiters, WaiterEvent{Type: "ADDED", Version: 12, Seen: at(101), UID: "wq", Lock: Lock, Owner: "pod:q", Limit: 1, Pod: "q"})
	h.Pods = append(h.Pods, PodInfo{UID: "q", Name: "g1-2", Lock: Lock, Limit: 1, QueuedAt: at(80)})
	h.Pods[0].NotAdmitted = at(1000)
	h.Permits[2].Owner = "pod:q"
	var r Report
	r.checkLine(h)
	if len(r.Violations) != 1 || !strings.Contains(r.Violations[0], "pod g1-2") || r.Line.NotAdmitted != 1 {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
	// Never told: p holds the line, and is reported.
	h.Pods[0].NotAdmitted = 0
	r = Report{}
	r.checkLine(h)
	if len(r.Violations) == 0 || !strings.Contains(r.Violations[0], "pod g1-1") {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
}

// A waiter left by an earlier call of the same owner (answered 503) gives
// no place to the owner's plain acquire that wins: it is a plain create.
func TestALeftoverWaiterGivesAPlainAcquireNoPlace(t *testing.T) {
	h := gapHistory()
	h.Waiters = append(h.Waiters, WaiterEvent{Type: "ADDED", Version: 5, Seen: at(50), UID: "wc", Lock: Lock, Owner: "c", Limit: 1})
	var r Report
	r.checkLine(h)
	if len(r.Violations) != 0 || r.Line.Excused[RuleGap] != 2 {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
	// Had the winning call waited, its waiter's place would be its own.
	for i := range h.Ops {
		if h.Ops[i].Owner == "c" {
			h.Ops[i].Wait = 2
		}
	}
	r = Report{}
	r.checkLine(h)
	if len(r.Violations) != 0 || r.Line.Excused[RuleGap] != 0 {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
}

// A pod queued first but placed behind a route waiter waits for it, and a
// pod queued after it but placed ahead of that waiter goes first.
func TestAGatedPodPlacedBehindARouteWaiterIsPassedByThePodsAheadOfIt(t *testing.T) {
	h := gatedLine("p", 5000, 80)
	h.Waiters[1].Version = 13
	h.Waiters = append(h.Waiters, WaiterEvent{Type: "ADDED", Version: 12, Seen: at(100), UID: "wa", Lock: Lock, Owner: "a", Limit: 1})
	var r Report
	r.checkLine(h)
	if len(r.Violations) != 0 || r.Line.Excused[RuleBehindAnother] != 1 {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
	// Without the route waiter between them, q's queued-at rules.
	h.Waiters = h.Waiters[:2]
	r = Report{}
	r.checkLine(h)
	if r.Line.Unexcused != 1 {
		t.Fatalf("violations %q, figures %+v", r.Violations, r.Line)
	}
}
