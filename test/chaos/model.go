package main

import (
	"fmt"
	"hash/fnv"
	"math"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// lease is the state of the sequential lease the model holds one lock to.
// A token or expiry set by an operation whose answer was lost is not known
// exactly; the model keeps a bound instead (a token above Token, an expiry
// at or after Expire) and the next answer that shows it pins it down.
type lease struct {
	Free        bool
	Owner       string
	Token       uint64 // exact, or (TokenExact false) the token is above it; on a free lease, the last one handed out
	TokenExact  bool
	Expire      int64 // Unix ns, server-stamped; exact, or (ExpireExact false) the lease ends at or after it
	ExpireExact bool
}

func exactLease(owner string, token uint64, expire int64) lease {
	return lease{Owner: owner, Token: token, TokenExact: true, Expire: expire, ExpireExact: true}
}

// leaseModel is the contract's lock, as a sequential specification: acquire
// wins a free or expired lease with a higher token, renew extends a lease
// its owner still holds and changes the token, release frees it, and so
// does a revoke (a delete of that version by somebody else). The times it
// compares are the server's stamps: an acquire or renew answers
// expiresAt = now + ttl, so its now is known exactly; for answers without a
// stamp (held, lost, released) the call's own times bound it, widened by b:
// a replica whose clock is behind judges a lease live for up to the skew
// past its end, and the route answers held, not taking it over, until the
// grace has passed too.
//
// Operations whose answer was lost (Unknown) may or may not have taken
// effect, at any moment after their call, so the model is nondeterministic
// and porcupine checks every possibility.
func leaseModel(b bounds) porcupine.NondeterministicModel {
	return porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{lease{Free: true, TokenExact: true}} },
		Step: func(state, input, _ interface{}) []interface{} {
			return b.step(state.(lease), input.(Op))
		},
		Hash: func(state interface{}) uint64 {
			h := fnv.New64a()
			fmt.Fprintf(h, "%+v", state.(lease))
			return h.Sum64()
		},
		DescribeOperation: func(input, _ interface{}) string { return input.(Op).String() },
		DescribeState: func(state interface{}) string {
			s := state.(lease)
			if s.Free {
				return fmt.Sprintf("free (last token %d)", s.Token)
			}
			return fmt.Sprintf("held by %s token %d (exact %t) until %s (exact %t)", s.Owner, s.Token, s.TokenExact, stamp(s.Expire), s.ExpireExact)
		},
	}
}

// bounds are the tolerances of a run, in ns: the manager's grace and the
// largest offset of a replica's clock.
type bounds struct{ grace, skew int64 }

func boundsOf(h History) bounds { return bounds{grace: h.Grace, skew: h.Skew} }

// step answers the states the lease can be in after op, none when op's
// answer is impossible from s.
func (b bounds) step(s lease, op Op) []interface{} {
	ttl := op.TTL * int64(time.Second)
	ok := func(cond bool, next lease) []interface{} {
		if cond {
			return []interface{}{next}
		}
		return nil
	}
	holds := !s.Free && s.Owner == op.Owner
	tokenIs := func(v uint64) bool { return v == s.Token || (!s.TokenExact && v > s.Token) }
	expireIs := func(v int64) bool { return v == s.Expire || (!s.ExpireExact && v >= s.Expire) }
	// Judged by the clock of a replica, t of the machine's clock is
	// somewhere in [t-skew, t+skew].
	mayHaveEnded := func(t int64) bool { return t+b.skew >= s.Expire }              // possible by t
	hadEnded := func(t int64) bool { return s.ExpireExact && t-b.skew >= s.Expire } // certain by t
	mayBeLive := func(t int64) bool { return !s.ExpireExact || t < s.Expire }       // possible at t (a stamp)
	tokenAtMost := func(v uint64) bool { return !s.TokenExact || v <= s.Token }     // v is not above the current token
	unknownAfter := func(expire int64) lease {                                      // a lease this owner got, values not seen
		return lease{Owner: op.Owner, Token: s.Token, Expire: expire}
	}

	switch op.Kind + "/" + op.Outcome {
	case KindAcquire + "/" + Acquired:
		now := op.ExpiresAt - ttl // a stamp, compared with a stamp
		return ok((s.Free || now >= s.Expire) && op.NewToken > s.Token, exactLease(op.Owner, op.NewToken, op.ExpiresAt))
	case KindAcquire + "/" + Already:
		return ok(holds && tokenIs(op.NewToken) && expireIs(op.ExpiresAt) && !hadEnded(op.Call),
			exactLease(op.Owner, op.NewToken, op.ExpiresAt))
	case KindAcquire + "/" + Held:
		if op.HolderOwner == "" || op.Waiting > 0 {
			// Held with no holder named, or with waiters in the lock's
			// line (a waiting acquire whose turn did not come in time,
			// or a plain one that left an expired slot to the waiters):
			// it says nothing of the lease; the line's order is not part
			// of this model.
			return ok(true, s)
		}
		// Held until the grace has passed after the end, by the answering
		// replica's clock.
		match := !s.Free && s.Owner == op.HolderOwner && tokenIs(op.HolderToken) && expireIs(op.HolderExpires) &&
			op.Call-b.skew < op.HolderExpires+b.grace
		return ok(match, exactLease(op.HolderOwner, op.HolderToken, op.HolderExpires))
	case KindAcquire + "/" + Contended:
		return ok(true, s)
	case KindAcquire + "/" + Unknown:
		// Applied at some now after the call, on a free lease or one that
		// had ended by then: the new lease ends ttl after that.
		from := op.Call - b.skew // the stamp of a replica whose clock is behind
		if !s.Free {
			from = max(from, s.Expire)
		}
		return []interface{}{s, unknownAfter(from + ttl)}

	case KindRenew + "/" + Renewed:
		now := op.ExpiresAt - ttl
		valid := holds && tokenAtMost(op.Token) && op.NewToken > s.Token && mayBeLive(now)
		return ok(valid, exactLease(op.Owner, op.NewToken, op.ExpiresAt))
	case KindRenew + "/" + Lost:
		return ok(!holds || (s.TokenExact && op.Token > s.Token) || mayHaveEnded(op.Return), s)
	case KindRelease + "/" + Lost:
		// A release of a lease whose end has passed by the answering
		// replica's clock deletes it all the same and answers lost: the
		// lease may be left as it was, or freed.
		if holds && tokenAtMost(op.Token) && mayHaveEnded(op.Return) {
			return []interface{}{s, lease{Free: true, Token: s.Token, TokenExact: s.TokenExact}}
		}
		return ok(!holds || (s.TokenExact && op.Token > s.Token) || mayHaveEnded(op.Return), s)
	case KindRenew + "/" + Unknown:
		if holds && !hadEnded(op.Call) {
			return []interface{}{s, unknownAfter(op.Call - b.skew + ttl)}
		}
		return []interface{}{s}

	case KindRelease + "/" + Released:
		valid := holds && tokenAtMost(op.Token) && !hadEnded(op.Call)
		return ok(valid, lease{Free: true, Token: s.Token, TokenExact: s.TokenExact})
	case KindRelease + "/" + Unknown:
		if holds && !hadEnded(op.Call) {
			return []interface{}{s, lease{Free: true, Token: s.Token, TokenExact: s.TokenExact}}
		}
		return []interface{}{s}

	// A revoke deletes exactly the version it names, live or expired.
	case KindRevoke + "/" + Released:
		return ok(!s.Free && s.Owner == op.Owner && tokenIs(op.Token), lease{Free: true, Token: op.Token, TokenExact: true})
	case KindRevoke + "/" + Lost:
		// Its version was gone: replaced, released, or (once the lease had
		// ended) deleted by the expiry controller, which the model does
		// not see.
		return ok(s.Free || s.Owner != op.Owner || !s.TokenExact || s.Token != op.Token || mayHaveEnded(op.Return), s)
	case KindRevoke + "/" + Unknown:
		if !s.Free && s.Owner == op.Owner && tokenIs(op.Token) {
			return []interface{}{s, lease{Free: true, Token: op.Token, TokenExact: true}}
		}
		return []interface{}{s}
	}
	return nil
}

// lockOps turns the client history into porcupine's operations: lock
// operations only, without the ones certainly not applied. An operation whose
// answer was lost may take effect any time after its call, so it returns at
// the end of time, or at its Until when the record bounds it.
func lockOps(ops []Op) []porcupine.Operation {
	var out []porcupine.Operation
	for _, op := range ops {
		if !isLockOp(op) || op.Outcome == Failed {
			continue
		}
		ret := op.Return
		switch {
		case op.Outcome != Unknown:
		case op.Until != 0:
			ret = op.Until
		default:
			ret = math.MaxInt64
		}
		out = append(out, porcupine.Operation{ClientId: op.Client, Input: op, Output: op, Call: op.Call, Return: ret})
	}
	return out
}

// isLockOp tells whether op is an operation on the run's main lock.
func isLockOp(op Op) bool {
	switch op.Kind {
	case KindAcquire, KindRenew, KindRelease, KindRevoke:
		return op.Lock == ""
	}
	return false
}

// checkLinearizable runs porcupine over the lock operations.
func checkLinearizable(ops []Op, b bounds, timeout time.Duration) (porcupine.CheckResult, porcupine.LinearizationInfo) {
	m := leaseModel(b)
	return porcupine.CheckOperationsVerbose(m.ToModel(), lockOps(ops), timeout)
}

// resolve settles lock operations whose answer was lost, from the record of
// what etcd committed, as far as it can. Owners are unique per acquisition,
// so a permit version of owner o that no acknowledged answer accounts for
// was made by one of o's unanswered calls:
//   - an unknown acquire or renew matched to such a version becomes
//     acquired or renewed with that version's token and expiry, returning
//     when the watcher saw it; matched to none, it did nothing (or was an
//     "already") and is dropped;
//   - an unknown release stays unknown if o's permit was deleted after the
//     call (by it, or by expiry: no record tells them apart), returning
//     when the delete was seen; otherwise it did nothing and is dropped.
//
// Without this, every lost answer would stay open to the end of the run and
// the search for an order would grow with each of them.
func resolve(ops []Op, permits []Event) (out []Op, resolved, dropped int) {
	type version struct {
		e    Event
		kind string
	}
	byOwner := map[string][]version{}
	var live *Event
	for i, e := range permits {
		kind := KindRenew
		switch {
		case e.Type == "DELETED" || e.Deleting:
			// The start of a foreground or orphan delete, or the end of a
			// delete: both bound a release.
			kind = KindRelease
		case e.Type == "ADDED" || live == nil || e.AcquireTime != live.AcquireTime:
			kind = KindAcquire
		}
		byOwner[e.Owner] = append(byOwner[e.Owner], version{e, kind})
		if e.Type == "DELETED" || e.Deleting {
			live = nil
		} else {
			live = &permits[i]
		}
	}
	index := map[uint64]int{}
	for i, e := range permits {
		index[e.Version] = i
	}
	answered := map[uint64]bool{}
	releasedBy := map[string]bool{}
	for _, op := range ops {
		switch op.Outcome {
		case Acquired, Renewed:
			answered[op.NewToken] = true
		case Released:
			releasedBy[op.Owner] = true
		}
	}
	sorted := append([]Op(nil), ops...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	used := map[uint64]bool{}
	for _, op := range sorted {
		if op.Outcome != Unknown || !isLockOp(op) {
			out = append(out, op)
			continue
		}
		if op.Kind == KindRevoke {
			// It names its version: a delete of that version seen after the
			// call bounds it (it, a release or an expiry); none, and it did
			// nothing.
			if i, ok := index[op.Token]; ok && i+1 < len(permits) && (permits[i+1].Type == "DELETED" || permits[i+1].Deleting) &&
				permits[i+1].Seen > op.Call {
				op.Until = permits[i+1].Seen
				resolved++
				out = append(out, op)
			} else {
				dropped++
			}
			continue
		}
		var match *version
		for i := range byOwner[op.Owner] {
			v := &byOwner[op.Owner][i]
			free := !used[v.e.Version] && !answered[v.e.Version] && !(v.kind == KindRelease && releasedBy[op.Owner])
			if v.kind == op.Kind && free && v.e.Seen > op.Call {
				match = v
				break
			}
		}
		if match == nil {
			dropped++
			continue
		}
		used[match.e.Version] = true
		resolved++
		switch op.Kind {
		case KindAcquire:
			op.Outcome = Acquired
		case KindRenew:
			op.Outcome = Renewed
		case KindRelease:
			op.Until = match.e.Seen // still unknown: a release or an expiry
		}
		if op.Outcome != Unknown {
			op.Return, op.NewToken, op.ExpiresAt = match.e.Seen, match.e.Version, match.e.ExpireTime
		}
		out = append(out, op)
	}
	return out, resolved, dropped
}
