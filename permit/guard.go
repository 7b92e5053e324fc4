package permit

import (
	"fmt"
	"strconv"
	"strings"
)

// Labels and annotations of guarded writes (fencing of Kubernetes objects).
const (
	// GuardedLabel opts an object in: only objects labelled
	// locks.queen.dev/guarded: "true" are sent to the guard webhook.
	GuardedLabel = "locks.queen.dev/guarded"
	// GuardAnnotation names the permit and token a write is made under:
	// "<lock>#<slot>=<token>".
	GuardAnnotation = "locks.queen.dev/guard"
	// FenceAnnotation is recorded by the webhook: the highest token the
	// object has accepted. A write with a lower token is refused.
	FenceAnnotation = "locks.queen.dev/fence"
)

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
		return Guard{}, fmt.Errorf("lock name %q: %v", g.Lock, err)
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
