// Package routeapi holds the JSON shapes of the lock route, as the contract
// writes them: the route answers with them, and the handles and the CLI
// read and print them, so every client sees the same fields.
package routeapi

import (
	"fmt"

	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// GuardNamespace is the guard's "ns": the namespace of lock keys in the
// contract's key space, the same for every lock.
const GuardNamespace = "queen-locks"

// Result is the answer to one operation. Fields appear in the contract's
// order; the ones an operation does not answer are left out.
type Result struct {
	Index     int       `json:"index"`
	Op        string    `json:"op"`
	Name      string    `json:"name"`
	Acquired  *bool     `json:"acquired,omitempty"`
	Renewed   *bool     `json:"renewed,omitempty"`
	Released  *bool     `json:"released,omitempty"`
	OK        *bool     `json:"ok,omitempty"`
	Already   bool      `json:"already,omitempty"`
	Slot      *int      `json:"slot,omitempty"`
	Token     *uint64   `json:"token,omitempty"`
	Owner     string    `json:"owner,omitempty"`
	ExpiresAt string    `json:"expiresAt,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	Holders   *[]Holder `json:"holders,omitempty"`
	// Waiting is how many wait in the lock's line: answered by get, and
	// by an acquire that answers held.
	Waiting *int   `json:"waiting,omitempty"`
	Guard   *Guard `json:"guard,omitempty"`
}

// Holder is one held permit, as get and a held acquire list it.
type Holder struct {
	Slot      int    `json:"slot"`
	Owner     string `json:"owner"`
	Token     uint64 `json:"token"`
	Since     string `json:"since"`
	RenewedAt string `json:"renewedAt"`
	ExpiresAt string `json:"expiresAt"`
}

// Guard is what a caller attaches to a write to fence it with the permit:
// a check that the permit is still held with this token.
type Guard struct {
	Op        string `json:"op"`
	NS        string `json:"ns"`
	Namespace string `json:"namespace"`
	Key       string `json:"key"`
	Expect    uint64 `json:"expect"`
	Required  bool   `json:"required"`
}

// GuardKey is the key of slot of lock in a guard: "<lock>#<slot>".
func GuardKey(lock string, slot int) string { return fmt.Sprintf("%s#%d", lock, slot) }

// Held fills in a permit the caller holds. An acquire answers the slot and
// owner; a renew answers only the new token, its expiry and guard.
func (r *Result) Held(p locks.Permit, ns, lock string, acquire bool) {
	tok := p.Token
	r.Token = &tok
	r.ExpiresAt = permit.FormatTime(p.ExpiresAt)
	if acquire {
		slot := p.Slot
		r.Slot, r.Owner = &slot, p.Owner
	}
	r.Guard = &Guard{Op: "check", NS: GuardNamespace, Namespace: ns, Key: GuardKey(lock, p.Slot), Expect: tok, Required: true}
}

// Holders lists holders in the contract's shape; never nil, so an empty list
// is written as [].
func Holders(hs []locks.Holder) *[]Holder {
	out := make([]Holder, 0, len(hs))
	for _, h := range hs {
		out = append(out, Holder{
			Slot: h.Slot, Owner: h.Owner, Token: h.Token,
			Since: permit.FormatTime(h.Since), RenewedAt: permit.FormatTime(h.RenewedAt), ExpiresAt: permit.FormatTime(h.ExpiresAt),
		})
	}
	return &out
}

// Outcome names the result in a word, for metrics and logs.
func (r Result) Outcome() string {
	switch {
	case r.Reason != "":
		return r.Reason
	case r.Already:
		return "already"
	case r.Acquired != nil:
		return "acquired"
	case r.Renewed != nil:
		return "renewed"
	case r.Released != nil:
		return "released"
	case r.OK != nil:
		return "ok"
	}
	return "answered"
}

// Error is the body of an answer other than 200.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Index   *int   `json:"index,omitempty"`
	Field   string `json:"field,omitempty"`
}

// Response is the body of a 200 answer.
type Response struct {
	Results []Result `json:"results"`
}

// ErrorResponse is the body of any other answer.
type ErrorResponse struct {
	Error Error `json:"error"`
}
