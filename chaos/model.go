package chaos

import (
	"fmt"
	"hash/fnv"
	"math"
	"time"

	"github.com/anishathalye/porcupine"
)

// lease is the state of the sequential lease the model holds one lock to.
// A zero Token or Expire is not known yet: it was set by an operation whose
// answer was lost, and the next answer that shows it fills it in.
type lease struct {
	Free   bool
	Owner  string
	Token  uint64 // on a free lease, the last token handed out
	Expire int64  // Unix ns, server-stamped
}

// leaseModel is the contract's lock, as a sequential specification: acquire
// wins a free or expired lease with a higher token, renew extends a lease
// its owner still holds and changes the token, release frees it. The times
// it compares are the server's stamps: an acquire or renew answers
// expiresAt = now + ttl, so its now is known exactly; for answers without a
// stamp (held, lost, released) the call's own times bound it.
//
// Operations whose answer was lost (Unknown) may or may not have taken
// effect, so the model is nondeterministic and porcupine checks every
// possibility.
var leaseModel = porcupine.NondeterministicModel{
	Init: func() []interface{} { return []interface{}{lease{Free: true}} },
	Step: func(state, input, _ interface{}) []interface{} {
		return step(state.(lease), input.(Op))
	},
	Hash: func(state interface{}) uint64 {
		s := state.(lease)
		h := fnv.New64a()
		fmt.Fprintf(h, "%t|%s|%d|%d", s.Free, s.Owner, s.Token, s.Expire)
		return h.Sum64()
	},
	DescribeOperation: func(input, _ interface{}) string { return input.(Op).String() },
	DescribeState: func(state interface{}) string {
		s := state.(lease)
		if s.Free {
			return fmt.Sprintf("free (last token %d)", s.Token)
		}
		return fmt.Sprintf("held by %s token %d until %s", s.Owner, s.Token, stamp(s.Expire))
	},
}

// step answers the states the lease can be in after op, none when op's
// answer is impossible from s.
func step(s lease, op Op) []interface{} {
	ttl := op.TTL * int64(time.Second)
	ok := func(cond bool, next lease) []interface{} {
		if cond {
			return []interface{}{next}
		}
		return nil
	}
	known := func(v, want uint64) bool { return v == 0 || v == want }
	// mayBeExpired: the lease could have ended by time t.
	mayBeExpired := func(t int64) bool { return s.Expire == 0 || t >= s.Expire }
	holds := !s.Free && s.Owner == op.Owner

	switch op.Kind + "/" + op.Outcome {
	case KindAcquire + "/" + Acquired:
		now := op.ExpiresAt - ttl
		higher := s.Token == 0 || op.NewToken > s.Token
		return ok((s.Free || mayBeExpired(now)) && higher,
			lease{Owner: op.Owner, Token: op.NewToken, Expire: op.ExpiresAt})
	case KindAcquire + "/" + Already:
		return ok(holds && known(s.Token, op.NewToken) && !mayBeExpiredStrict(s, op.Call),
			lease{Owner: op.Owner, Token: op.NewToken, Expire: op.ExpiresAt})
	case KindAcquire + "/" + Held:
		match := !s.Free && s.Owner == op.HolderOwner && known(s.Token, op.HolderToken) &&
			(s.Expire == 0 || s.Expire == op.HolderExpires) && op.Call < op.HolderExpires
		return ok(match, lease{Owner: op.HolderOwner, Token: op.HolderToken, Expire: op.HolderExpires})
	case KindAcquire + "/" + Contended:
		return ok(true, s)
	case KindAcquire + "/" + Unknown:
		return []interface{}{s, lease{Owner: op.Owner}}

	case KindRenew + "/" + Renewed:
		now := op.ExpiresAt - ttl
		valid := holds && (s.Token == 0 || (op.Token <= s.Token && op.NewToken > s.Token)) &&
			(s.Expire == 0 || now < s.Expire)
		return ok(valid, lease{Owner: op.Owner, Token: op.NewToken, Expire: op.ExpiresAt})
	case KindRenew + "/" + Lost, KindRelease + "/" + Lost:
		return ok(!holds || (s.Token != 0 && op.Token > s.Token) || mayBeExpired(op.Return), s)
	case KindRenew + "/" + Unknown:
		if holds {
			return []interface{}{s, lease{Owner: op.Owner}}
		}
		return []interface{}{s}

	case KindRelease + "/" + Released:
		valid := holds && (s.Token == 0 || op.Token <= s.Token) && !mayBeExpiredStrict(s, op.Call)
		return ok(valid, lease{Free: true, Token: s.Token})
	case KindRelease + "/" + Unknown:
		if holds {
			return []interface{}{s, lease{Free: true, Token: s.Token}}
		}
		return []interface{}{s}
	}
	return nil
}

// mayBeExpiredStrict: the lease had certainly ended by t (so an answer that
// needs it live at some moment after t is impossible). An unknown expiry
// proves nothing.
func mayBeExpiredStrict(s lease, t int64) bool { return s.Expire != 0 && t >= s.Expire }

// lockOps turns the client history into porcupine's operations: lock
// operations only, without the ones certainly not applied. An operation whose
// answer was lost may take effect any time after its call, so it returns at
// the end of time.
func lockOps(ops []Op) []porcupine.Operation {
	var out []porcupine.Operation
	for _, op := range ops {
		if op.Kind == KindWrite || op.Outcome == Failed {
			continue
		}
		ret := op.Return
		if op.Outcome == Unknown {
			ret = math.MaxInt64
		}
		out = append(out, porcupine.Operation{ClientId: op.Client, Input: op, Output: op, Call: op.Call, Return: ret})
	}
	return out
}

// checkLinearizable runs porcupine over the lock operations.
func checkLinearizable(ops []Op, timeout time.Duration) (porcupine.CheckResult, porcupine.LinearizationInfo) {
	return porcupine.CheckOperationsVerbose(leaseModel.ToModel(), lockOps(ops), timeout)
}
