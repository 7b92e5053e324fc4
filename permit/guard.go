package permit

import (
	"fmt"
	"strconv"
	"strings"
)

// Labels and annotations of guarded writes (fencing of Kubernetes objects).
const (
	// GuardedLabel opts an object in: only objects labelled
	// locks.queen.dev/guarded: "true" are sent to the guard webhooks.
	GuardedLabel = "locks.queen.dev/guarded"
	// GuardAnnotation names the permit and token a write is made under:
	// "<lock>#<slot>=<token>". Every write to a guarded object carries its
	// own; the webhook removes it before the object is stored, so a write
	// that sends none is never judged by an earlier writer's guard.
	GuardAnnotation = "locks.queen.dev/guard"
	// FenceAnnotation is the record the webhook keeps on a guarded object:
	// the lock and slot the object is bound to and the highest token it
	// has accepted, as "<lock>#<slot>=<token>". Clients cannot write it:
	// the webhook sets it from the guard of each admitted write.
	FenceAnnotation = "locks.queen.dev/fence"
	// DeletableAnnotation, written with "true" under a current guard, lets
	// the object be deleted while that guard's token is still current. A
	// delete carries no annotations, so this is how it carries a guard.
	DeletableAnnotation = "locks.queen.dev/deletable"
	// OverrideAnnotation, sent with any value by a user allowed the verb
	// "override" on guards.locks.queen.dev in the namespace, admits a write
	// without a guard and takes the object out of the fence (label and
	// record removed). The same right lets that user delete a guarded
	// object.
	OverrideAnnotation = "locks.queen.dev/override"
	// SlotLabel names, on every bound object, the lock and slot it is
	// bound to, as SlotLabelValue: the guard webhook sets it at every
	// guarded write, so that people find a slot's objects with a label
	// selector. Acquires find them in the slot's QueenLockFence.
	SlotLabel = "locks.queen.dev/fence-slot"
	// RaiseAnnotation, sent by the queen-locks manager alone as
	// "<lock>#<slot>=<token>", raises the record of an object bound to that
	// lock and slot to at least that token. The guard webhook turns it into
	// the record and removes it; from anyone else it is refused.
	RaiseAnnotation = "locks.queen.dev/raise"
	// MaxBoundPerSlot is how many objects may be bound to one slot of a
	// lock: every acquire of the slot writes each of them before it
	// answers, so they must fit well inside a webhook's timeout.
	MaxBoundPerSlot = 32
)

// SlotLabelValue is the value of SlotLabel for slot of lock: a hash of both,
// which is a valid label value whatever the lock is called. Two slots may
// share one only by a SHA-256 collision, and readers compare the record
// anyway.
func SlotLabelValue(lock string, slot int) string {
	return "s-" + hash(lock+"#"+strconv.Itoa(slot))
}

// ParseFence reads a fence record. A bare token is the record written by
// versions before records named their lock: it binds no lock.
func ParseFence(s string) (g Guard, bound bool, err error) {
	if t, err := Token(s); err == nil {
		return Guard{Token: t}, false, nil
	}
	g, err = ParseGuard(s)
	return g, err == nil, err
}

// Guard is a parsed guard annotation.
type Guard struct {
	Lock  string
	Slot  int
	Token uint64
}

func (g Guard) String() string { return fmt.Sprintf("%s#%d=%d", g.Lock, g.Slot, g.Token) }

// ParseGuard reads "<lock>#<slot>=<token>". Lock names cannot hold '#', so
// the last '#' splits the lock from the slot.
func ParseGuard(s string) (Guard, error) {
	const want = `want "<lock>#<slot>=<token>", for example "daily-report#0=90101"`
	i := strings.LastIndexByte(s, '#')
	if i < 0 {
		return Guard{}, fmt.Errorf("%q has no '#': %s", s, want)
	}
	slotStr, tokStr, ok := strings.Cut(s[i+1:], "=")
	if !ok {
		return Guard{}, fmt.Errorf("%q has no '=': %s", s, want)
	}
	g := Guard{Lock: s[:i]}
	if err := ValidateName(g.Lock); err != nil {
		return Guard{}, fmt.Errorf("lock name %q: %w", g.Lock, err)
	}
	slot, err := strconv.Atoi(slotStr)
	if err != nil || ValidateSlot(int64(slot), MaxLimit) != nil {
		return Guard{}, fmt.Errorf("slot %q: must be a whole number from 0 to %d", slotStr, MaxLimit-1)
	}
	g.Slot = slot
	if g.Token, err = Token(tokStr); err != nil {
		return Guard{}, fmt.Errorf("token %q: must be a positive whole number", tokStr)
	}
	return g, nil
}
