package guard

import (
	"context"
	"errors"

	"github.com/queen-locks/queen-locks/permit"
)

// Fence is the permit a guarded write is made under: the lock, its slot and
// the token the permit has now.
type Fence struct {
	// Namespace is where the permit lives, or "" when the source does not
	// know (a handle over the route, whose namespace the server decides).
	// The webhook judges a guard by the permit in the object's own
	// namespace, so the client refuses, without sending, a guarded write to
	// another namespace when this is set.
	Namespace string
	Lock      string
	Slot      int
	Token     uint64
}

// Annotation is the value of the guard annotation, "<lock>#<slot>=<token>".
func (f Fence) Annotation() string {
	return permit.Guard{Lock: f.Lock, Slot: f.Slot, Token: f.Token}.String()
}

// Labels is the label that opts an object in to the guard.
func (f Fence) Labels() map[string]string { return map[string]string{permit.GuardedLabel: "true"} }

// Annotations is the guard a write carries.
func (f Fence) Annotations() map[string]string {
	return map[string]string{permit.GuardAnnotation: f.Annotation()}
}

// Source is the holding a guarded client writes under: a lock handle, or a
// leader election's lock. Its methods are called concurrently, from every
// write, and must not wait on those writes.
type Source interface {
	// Current is the fence to send now, read at the moment of sending:
	// every renew changes the token, so a copy kept across a renew refuses
	// the holder's own write. ok is false when nothing is held (never
	// acquired, released, or lost).
	Current() (f Fence, ok bool)
	// Refresh is asked after the webhook refused a write under refused
	// with kv_precondition. It answers the fence the same holding has now
	// (same owner, same acquisition), which differs from refused when the
	// holder's own renew moved the token meanwhile and is the same when
	// the permit is still held with refused's token (the refusal is then
	// about the object, not the holding). held is false when the holding
	// is gone: taken over, expired or released. err is for when the source
	// could not tell; the client then reports the refusal and err, and
	// nothing is lost.
	Refresh(ctx context.Context, refused Fence) (f Fence, held bool, err error)
	// Lose reports the holding lost with reason, "guard" for a refused
	// write. It is called at most once per client, after a Refresh that
	// answered held false.
	Lose(reason string)
}

// LostGuard is the loss reason a refused write reports, as the handles name it.
const LostGuard = "guard"

// Errors of writes the client refuses without sending them. Match them with
// errors.Is.
var (
	// ErrLost: a write through this client was refused because its holding
	// is gone; the source was told, and the client sends no more writes.
	ErrLost = errors.New("queen-locks guard: the holding was lost: this client sends no more writes")
	// ErrNotHeld: the source holds nothing now.
	ErrNotHeld = errors.New("queen-locks guard: the lock is not held")
)
