package route

import (
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/queen-locks/queen-locks/permit"
)

// decodeFast reads, in one pass and with few allocations, the calls that
// the handles, the CLI and most clients send: an object of namespace and
// operations, each operation an object of known fields whose strings carry
// no escape and whose numbers are plain whole numbers. It answers ok only
// for a call it read whole and found valid; anything else (an escape, a
// fraction, a duplicate, an unknown field, any mistake at all) answers
// !ok, and Decode reads the body again the careful way, which finds the
// same call or names what is wrong. So it never decides a refusal, and
// FuzzDecodeFast holds it to Decode's answers.
//
// Decode costs the route about 40 µs and 140 allocations per call on the
// bench machine, most of it encoding/json taking the body apart three
// times over (into raw values, members, then strings and numbers).
func decodeFast(body []byte) (*Request, bool) {
	s := scanner{b: body}
	if !s.next('{') {
		return nil, false
	}
	req := &Request{}
	var haveNS, haveOps bool
	for first := true; ; first = false {
		if s.next('}') {
			break
		}
		if !first && !s.next(',') {
			return nil, false
		}
		key, ok := s.key()
		if !ok {
			return nil, false
		}
		switch {
		case key == "namespace" && !haveNS:
			haveNS = true
			ns, ok := s.str()
			if !ok || len(validation.IsDNS1123Label(ns)) > 0 {
				return nil, false
			}
			req.Namespace = ns
		case key == "operations" && !haveOps:
			haveOps = true
			if req.Operations, ok = s.operations(); !ok {
				return nil, false
			}
		default:
			return nil, false
		}
	}
	if !haveOps || !s.end() {
		return nil, false
	}
	return req, true
}

// operations reads the operations array and checks what Decode checks
// of the call as a whole: their count, distinct names, slots in all.
func (s *scanner) operations() ([]Operation, bool) {
	if !s.next('[') {
		return nil, false
	}
	var ops []Operation
	slots := 0
	for first := true; ; first = false {
		if s.next(']') {
			break
		}
		if !first && !s.next(',') {
			return nil, false
		}
		op, ok := s.operation()
		if !ok {
			return nil, false
		}
		for _, o := range ops {
			if o.Name == op.Name {
				return nil, false
			}
		}
		slots += op.Limit
		ops = append(ops, op)
		if len(ops) > permit.MaxOperations || slots > permit.MaxSlotsPerCall {
			return nil, false
		}
	}
	return ops, len(ops) > 0
}

// The fields of an operation, as bits: which were sent, and which each op
// takes and needs (fields, in request.go, says the same).
const (
	fOp = 1 << iota
	fName
	fOwner
	fTTL
	fLimit
	fWait
	fSlot
	fToken
	fExpect
)

var fastFields = map[string]struct{ takes, needs int }{
	OpAcquire: {fOp | fName | fTTL | fOwner | fLimit | fWait, fOp | fName | fTTL},
	OpRenew:   {fOp | fName | fSlot | fToken | fOwner | fTTL, fOp | fName | fToken},
	OpRelease: {fOp | fName | fSlot | fToken | fOwner, fOp | fName | fToken},
	OpGet:     {fOp | fName, fOp | fName},
	OpCheck:   {fOp | fName | fSlot | fExpect, fOp | fName | fExpect},
}

// operation reads one operation object.
func (s *scanner) operation() (Operation, bool) {
	op := Operation{Limit: 1}
	if !s.next('{') {
		return op, false
	}
	seen := 0
	for first := true; ; first = false {
		if s.next('}') {
			break
		}
		if !first && !s.next(',') {
			return op, false
		}
		key, ok := s.key()
		if !ok {
			return op, false
		}
		var bit int
		var n uint64
		switch key {
		case "op":
			bit = fOp
			op.Op, ok = s.str()
		case "name":
			bit = fName
			op.Name, ok = s.str()
			ok = ok && permit.ValidateName(op.Name) == nil
		case "owner":
			bit = fOwner
			op.Owner, ok = s.str()
			ok = ok && permit.ValidateOwnerOf(op.Owner) == nil
		case "ttlSeconds":
			bit = fTTL
			n, ok = s.whole(1, permit.MaxTTLSeconds)
			op.TTLSeconds = int64(n)
		case "waitSeconds":
			bit = fWait
			n, ok = s.whole(0, uint64(MaxWait/time.Second))
			op.WaitSeconds = int(n)
		case "limit":
			bit = fLimit
			n, ok = s.whole(1, permit.MaxLimit)
			op.Limit = int(n)
		case "slot":
			bit = fSlot
			n, ok = s.whole(0, permit.MaxLimit-1)
			op.Slot = int(n)
		case "token":
			bit = fToken
			op.Token, ok = s.whole(1, 1<<64-1)
		case "expect":
			bit = fExpect
			op.Expect, ok = s.whole(1, 1<<64-1)
		}
		if !ok || bit == 0 || seen&bit != 0 {
			return op, false
		}
		seen |= bit
	}
	f, known := fastFields[op.Op]
	return op, known && seen&^f.takes == 0 && seen&f.needs == f.needs
}

// scanner walks a JSON body for decodeFast.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// next consumes c, after any space, when it comes next.
func (s *scanner) next(c byte) bool {
	s.space()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// end tells whether only space is left.
func (s *scanner) end() bool {
	s.space()
	return s.i == len(s.b)
}

// key reads a member's name and its colon.
func (s *scanner) key() (string, bool) {
	k, ok := s.str()
	return k, ok && s.next(':')
}

// str reads a string without escapes or control characters (the body is
// valid UTF-8, checked before).
func (s *scanner) str() (string, bool) {
	if !s.next('"') {
		return "", false
	}
	start := s.i
	for ; s.i < len(s.b); s.i++ {
		switch c := s.b[s.i]; {
		case c == '"':
			v := string(s.b[start:s.i])
			s.i++
			return v, true
		case c == '\\' || c < 0x20:
			return "", false
		}
	}
	return "", false
}

// whole reads a whole number in [lo, hi] written plainly: digits, no sign,
// no leading zero, no fraction or exponent after it.
func (s *scanner) whole(lo, hi uint64) (uint64, bool) {
	s.space()
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	digits := s.b[start:s.i]
	if len(digits) == 0 || (digits[0] == '0' && len(digits) > 1) {
		return 0, false
	}
	if s.i < len(s.b) {
		switch s.b[s.i] {
		case '.', 'e', 'E':
			return 0, false
		}
	}
	n, err := strconv.ParseUint(string(digits), 10, 64)
	return n, err == nil && n >= lo && n <= hi
}
