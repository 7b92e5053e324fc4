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
)

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
