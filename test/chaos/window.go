package main

import (
	"fmt"
	"sort"
	"time"
)

// The stricter fencing check: once the next holder's acquire has been
// answered, no write or delete of an earlier holder of the slot may be
// stored (docs/fencing.md, "no window"). A write checked while its token
// was current and stored later is allowed only while that is not so.
//
// When a write was stored is known only within bounds: after every
// recorded write that etcd committed before it (each was sent by its
// client at a known time, so the store came after that), and before the
// watcher saw it. When an acquire was answered is known only as before its
// client got the answer. So a write is reported only when it was certainly
// stored after the answer: some write committed before it was sent after
// the answer came back. A write whose store cannot be placed that late is
// counted (Report.Window), as one stored before the answer.

// createDeadline is the bound docs/fencing.md puts on a replaced holder's
// create or opt-in: kube-apiserver's request deadline (60 s) after the
// request reached it, plus the longest a client may be stopped between
// noting its call and sending it (the nemesis pauses clients for at most
// the TTL plus 2 s; 5 s covers the chaos default of 2 s).
const createDeadline = 65 * time.Second

// succession answers, for the checks, when acquires were answered and how
// late a version was certainly stored.
type succession struct {
	// answered: a holding's first token -> the earliest moment a client
	// had the answer that it acquired it.
	answered map[uint64]int64
	// after is every recorded write with a known version, by version,
	// with the latest call time up to it (a running maximum).
	after []sentAt
	// lateCreates counts, per replaced holding (its first token), the
	// creates of its holder stored after the next acquire was answered.
	lateCreates map[uint64]int
}

type sentAt struct {
	version uint64
	call    int64 // the largest call time of a write committed at or before version
}

func newSuccession(h History) *succession {
	s := &succession{answered: map[uint64]int64{}, lateCreates: map[uint64]int{}}
	for _, op := range h.Ops {
		switch {
		case op.Kind == KindAcquire && op.Lock == "" && (op.Outcome == Acquired || op.Outcome == Already) && op.NewToken != 0:
			if t, ok := s.answered[op.NewToken]; !ok || op.Return < t {
				s.answered[op.NewToken] = op.Return
			}
			if op.Outcome == Acquired {
				// An already answer read a version that may have been
				// stored before it was sent: only a win wrote it.
				s.after = append(s.after, sentAt{op.NewToken, op.Call})
			}
		case op.Kind == KindRenew && op.Lock == "" && op.Outcome == Renewed && op.NewToken != 0:
			s.after = append(s.after, sentAt{op.NewToken, op.Call})
		case op.Kind == KindWrite && op.Outcome == Written && op.Version != 0:
			s.after = append(s.after, sentAt{op.Version, op.Call})
		}
	}
	sort.Slice(s.after, func(i, j int) bool { return s.after[i].version < s.after[j].version })
	for i := 1; i < len(s.after); i++ {
		s.after[i].call = max(s.after[i].call, s.after[i-1].call)
	}
	return s
}

// storedAfter is a moment version v was certainly stored after: the
// latest call of a write etcd committed before it; 0 when none is known.
func (s *succession) storedAfter(v uint64) int64 {
	i := sort.Search(len(s.after), func(i int) bool { return s.after[i].version >= v })
	if i == 0 {
		return 0
	}
	return s.after[i-1].call
}

// beginsHolding tells whether permit version j starts a holding: a
// create, or a takeover (another acquireTime or owner than the version
// before).
func beginsHolding(ps []Event, j int) bool {
	p := ps[j]
	if p.Type == "DELETED" || p.Deleting {
		return false
	}
	if p.Type == "ADDED" || j == 0 {
		return true
	}
	q := ps[j-1]
	return q.Type == "DELETED" || p.AcquireTime != q.AcquireTime || p.Owner != q.Owner
}

// replacedBy looks for a holding that began after permit version i and
// before version v was stored, and whose acquire was answered before v was
// certainly stored. It answers that holding's first version and when its
// answer came back; ok is false when there is none.
func (s *succession) replacedBy(ps []Event, i int, v uint64) (next Event, answered int64, ok bool) {
	storedAfter := s.storedAfter(v)
	for j := i + 1; j < len(ps) && ps[j].Version < v; j++ {
		if !beginsHolding(ps, j) {
			continue
		}
		if t, known := s.answered[ps[j].Version]; known && t < storedAfter {
			return ps[j], t, true
		}
	}
	return Event{}, 0, false
}

// checkLate reports a write (or a delete) of the holding whose permit
// version is ps[i], stored at version w.Version, when it was stored after
// the next holder's acquire was answered. A create of a replaced holder
// is the one case docs/fencing.md bounds instead: one per replaced
// holding, stored within createDeadline of its call. It answers whether
// the stored version was such a bounded create (so the caller need not
// hold it to the order of tokens) and whether it reported anything.
func (r *Report) checkLate(s *succession, ps []Event, i int, w Event, call int64, what string) (bounded, reported bool) {
	next, answered, ok := s.replacedBy(ps, i, w.Version)
	if !ok {
		return false, false
	}
	stored := s.storedAfter(w.Version)
	if w.Type == "ADDED" {
		first := holdingStart(ps, i)
		s.lateCreates[first]++
		switch {
		case s.lateCreates[first] > 1:
			r.violate(fmt.Sprintf("fence: %s (version %d, token %d) is the holding of version %d's second create stored after %s's acquire (version %d) was answered at %s: the bound is one",
				what, w.Version, w.Token, first, next.Owner, next.Version, stamp(answered)))
			return false, true
		case stored-call > int64(createDeadline):
			r.violate(fmt.Sprintf("fence: %s (version %d, token %d), sent at %s, was stored after %s, more than %s later, and after %s's acquire (version %d) was answered at %s",
				what, w.Version, w.Token, stamp(call), stamp(stored), createDeadline, next.Owner, next.Version, stamp(answered)))
			return false, true
		}
		r.LateCreates++
		return true, false
	}
	r.violate(fmt.Sprintf("fence: %s (version %d, token %d) was stored after %s's acquire (version %d) was answered at %s: a write sent at %s was committed before it",
		what, w.Version, w.Token, next.Owner, next.Version, stamp(answered), stamp(stored)))
	return false, true
}

// holdingStart is the first version of the holding permit version i
// belongs to.
func holdingStart(ps []Event, i int) uint64 {
	for ; i > 0 && !beginsHolding(ps, i); i-- {
	}
	return ps[i].Version
}
