package main

import (
	"strings"
	"testing"
	"time"
)

// heldWriteHistory: goodHistory, then a's write under token 102, sent at
// 85 ms (before its release was seen), is held inside kube-apiserver and
// stored at version 106, after b's acquire (version 104) was answered at
// 110 ms. With renewed, b's renew (sent at 115 ms, after that answer)
// is stored before it, at 105: the held write was certainly stored after
// the answer. Without it, nothing says it was not stored before.
func heldWriteHistory(renewed bool) History {
	h := goodHistory()
	h.Ops = h.Ops[:6] // up to b's acquire
	h.Ops = append(h.Ops, Op{Client: 0, Kind: KindWrite, Owner: "a", Token: 102, Guard: "chaos#0=102", Call: at(85), Return: at(140), Outcome: Unknown, Counter: 2})
	h.Objects = h.Objects[:1]
	if renewed {
		h.Ops = append(h.Ops, Op{Client: 1, Kind: KindRenew, Owner: "b", Token: 104, TTL: 2, Call: at(115), Return: at(125), Outcome: Renewed, NewToken: 105, ExpiresAt: at(2120)})
		h.Permits = append(h.Permits, Event{Type: "MODIFIED", Version: 105, Seen: at(122), Owner: "b", AcquireTime: at(105), RenewTime: at(120), ExpireTime: at(2120)})
	}
	h.Objects = append(h.Objects, Event{Type: "MODIFIED", Version: 106, Seen: at(130), Counter: 2, Token: 102, Writer: "a", Fence: 102, FenceLock: "chaos#0"})
	return h
}

func TestAHeldWriteStoredAfterTheNextAcquireWasAnsweredIsAViolation(t *testing.T) {
	r := Check(heldWriteHistory(true), 10*time.Second)
	mustFind(t, r, "the write of counter 2 (version 106, token 102) was stored after b's acquire (version 104) was answered")
	if r.Window != 0 {
		t.Fatalf("window %d, want 0: the write is a violation, not a window write", r.Window)
	}

	// Nothing recorded shows the store came after the answer: counted.
	r = Check(heldWriteHistory(false), 10*time.Second)
	if len(r.Violations) != 0 || r.Window != 1 {
		t.Fatalf("violations %q, window %d", r.Violations, r.Window)
	}
}

// An acquire raises the record before it answers; a write of an earlier
// token stored after the raise is a hole in the fence, whenever the
// answer came.
func TestAWriteStoredAfterTheRaiseIsAViolation(t *testing.T) {
	h := heldWriteHistory(false)
	raise := Event{Type: "MODIFIED", Version: 105, Seen: at(109), Counter: 1, Token: 100, Writer: "a", Fence: 104, FenceLock: "chaos#0"}
	h.Objects = []Event{h.Objects[0], raise, h.Objects[1]}
	r := Check(h, 10*time.Second)
	mustFind(t, r, "accepted token 102 at version 106 after an acquire raised its record to 104")
}

// A held delete is judged like a held write: a marked the object
// deletable under token 100 and sent its delete at 65 ms, while 100 was
// current; it was stored after b's answer.
func TestAHeldDeleteStoredAfterTheNextAcquireWasAnsweredIsAViolation(t *testing.T) {
	h := heldWriteHistory(true)
	h.Ops[2].Deletable = true
	h.Ops[6] = Op{Client: 0, Kind: KindDelete, Owner: "a", Token: 100, Call: at(65), Return: at(140), Outcome: Unknown}
	h.Objects[0].Deletable = "100"
	h.Objects[1] = Event{Type: "DELETED", Version: 106, Seen: at(130), Counter: 1, Token: 100, Writer: "a", Fence: 100, FenceLock: "chaos#0", Deletable: "100"}
	r := Check(h, 10*time.Second)
	mustFind(t, r, "the delete of the ConfigMap (version 106, token 100) was stored after b's acquire (version 104) was answered")
}

// A replaced holder's create stored after the next acquire was answered
// is the case docs/fencing.md bounds: one per replaced holding, counted;
// a second is a violation.
func TestAReplacedHoldersCreateIsBoundedToOne(t *testing.T) {
	h := heldWriteHistory(true)
	// The object was deleted (under a's mark) before the held create.
	h.Ops[6].Create = true
	h.Objects = []Event{
		h.Objects[0],
		{Type: "DELETED", Version: 101, Seen: at(49), Counter: 1, Token: 100, Writer: "a", Fence: 100, FenceLock: "chaos#0", Deletable: "100"},
		{Type: "ADDED", Version: 106, Seen: at(130), Counter: 2, Token: 102, Writer: "a", Fence: 102, FenceLock: "chaos#0"},
	}
	h.Objects[0].Deletable = "100"
	h.Ops = append(h.Ops, Op{Client: 0, Kind: KindDelete, Owner: "a", Token: 100, Call: at(45), Return: at(50), Outcome: Deleted})
	h.Ops[2].Version = 100 // a's first write, stored before the delete
	h.Objects[0].Version = 100
	h.Permits[0].Version, h.Ops[0].NewToken = 99, 99
	h.Ops[2].Token, h.Ops[2].Guard = 99, "chaos#0=99"
	h.Objects[0].Token, h.Objects[0].Fence, h.Objects[0].Deletable = 99, 99, "99"
	h.Objects[1].Token, h.Objects[1].Fence, h.Objects[1].Deletable = 99, 99, "99"
	h.Ops[len(h.Ops)-1].Token = 99
	r := Check(h, 10*time.Second)
	if r.LateCreates != 1 {
		t.Fatalf("late creates %d, violations %q", r.LateCreates, r.Violations)
	}
	for _, v := range r.Violations {
		if strings.Contains(v, "version 106") {
			t.Fatalf("the bounded create was reported: %q", v)
		}
	}

	// A second create of the same replaced holding, after its first was
	// deleted again, is past the bound.
	h.Ops = append(h.Ops, Op{Client: 0, Kind: KindWrite, Owner: "a", Token: 102, Guard: "chaos#0=102", Create: true, Call: at(86), Return: at(200), Outcome: Unknown, Counter: 3})
	h.Objects = append(h.Objects,
		Event{Type: "DELETED", Version: 107, Seen: at(140), Counter: 2, Token: 102, Writer: "a", Fence: 102, FenceLock: "chaos#0"},
		Event{Type: "ADDED", Version: 108, Seen: at(150), Counter: 3, Token: 102, Writer: "a", Fence: 102, FenceLock: "chaos#0"})
	mustFind(t, Check(h, 10*time.Second), "second create stored after b's acquire")
}
