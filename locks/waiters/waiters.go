// Package waiters wakes acquires that wait for a permit of a lock to free: on
// the delete of a permit, and when a permit reaches its expireTime plus the
// skew grace, as a watch of permits reports them. Waiting costs the API
// server nothing while nothing changes.
//
// Waking does not stampede. Each free slot wakes one waiter, the one that
// has waited longest on this replica. A woken waiter that loses its try to
// somebody else does not wake the next one: the slot is taken, and another
// try would only cost the API server a write that must fail. It passes the
// wake on only to a waiter whose limit reaches further than its own, which
// may find a slot it could not. A slot that frees while every waiter is
// already trying is not forgotten: the first try to end tries again; and
// a wake that reaches a waiter whose try then wins is passed on, since
// that try may have taken another slot. A permit written for a waiter's
// own owner wakes that waiter, whose try then answers already. Across
// replicas there is no order: each wakes its own waiters.
package waiters

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
)

// Lister lists the permits of a lock as a watch's cache has them, to learn
// their expiry when the lock gets its first waiter.
type Lister func(ns, lock string) []locksv1alpha1.QueenLock

// Hub holds the waiters of one replica. Feed it every permit event with
// Seen and Gone.
type Hub struct {
	max    int
	grace  time.Duration
	lister Lister

	// ready is false while the feed that fills the lister's cache is not
	// yet registered for its events: a waiter must not sleep on that
	// cache then, since a change made meanwhile would wake nobody.
	ready atomic.Bool

	// line lists a lock's waiters as the manager's cache has them; nil
	// when the hub has no such cache (then acquires wait unordered).
	line      LineLister
	lineReady atomic.Bool
	lineDown  atomic.Bool // the waiters' resource cannot be watched

	mu      sync.Mutex
	waiting int
	locks   map[key]*queue
	follows map[key]map[*follow]struct{}
}

type key struct{ ns, lock string }

// queue is the waiters of one lock, longest waiting first, and a timer per
// permit of the lock that fires at its expireTime plus the grace.
type queue struct {
	waiters []*Waiter
	timers  map[string]*time.Timer // by permit name
	// missed counts wakes that found every waiter trying already: a slot
	// may have freed after those tries read the lock.
	missed int
}

// NewHub makes a hub that lets at most max calls wait at once. lister may
// be nil: then only events after a waiter arrived arm expiry timers.
func NewHub(max int, grace time.Duration, lister Lister) *Hub {
	h := &Hub{max: max, grace: grace, lister: lister, locks: map[key]*queue{}, follows: map[key]map[*follow]struct{}{}}
	h.ready.Store(true)
	return h
}

// Waiter is one waiting acquire.
type Waiter struct {
	h     *Hub
	k     key
	owner string
	limit int
	c     chan int // the slot that freed, or -1 when it is not known
	hot   bool     // woken, and has not yet said how its try went
	aim   int      // while hot, the slot it was woken for, or -1
	lost  bool     // has lost a try: it sleeps until woken
	// mine is set when a permit of the waiter's owner was written while
	// it was awake: its try may have read the lock before, so a lost try
	// tries again.
	mine bool
}

// C is signalled when a slot may have freed, with that slot when it is
// known (-1 otherwise): try to acquire, then call Tried.
func (w *Waiter) C() <-chan int { return w.c }

// Wait queues a waiter of owner for lock in ns, a semaphore of limit. It
// answers false when the replica already has as many waiting calls as it
// allows: the caller then answers at once, as without a wait.
func (h *Hub) Wait(ns, lock, owner string, limit int) (locks.Waiter, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiting >= h.max {
		return nil, false
	}
	h.waiting++
	k := key{ns, lock}
	q := h.locks[k]
	fresh := q == nil
	if fresh {
		q = &queue{timers: map[string]*time.Timer{}}
		h.locks[k] = q
	}
	w := &Waiter{h: h, k: k, owner: owner, limit: limit, c: make(chan int, 1)}
	q.waiters = append(q.waiters, w)
	if fresh && h.lister != nil {
		// The lister reads a cache, never the API server, so it is cheap
		// enough to call under the lock.
		ps := h.lister(ns, lock)
		for i := range ps {
			h.armLocked(&ps[i])
		}
	}
	return w, true
}

// Permits answers the lock's permits as the hub's lister has them; false
// when the hub has no lister. Read after Wait, it misses no change: every
// change the lister has not seen yet is still to come to Seen or Gone,
// which wake the waiter.
func (w *Waiter) Permits() ([]locksv1alpha1.QueenLock, bool) {
	if w.h.lister == nil || !w.h.ready.Load() {
		return nil, false
	}
	return w.h.lister(w.k.ns, w.k.lock), true
}

// Sleep puts the waiter to sleep without a try, as if it had lost one,
// when each of the free slots its cache showed (none, or a few) is being
// tried by a waiter woken for that very slot. It answers false, and the
// waiter must try after all, when a wake came since it was queued, or
// when a free slot has no such waiter.
//
// A woken waiter takes its slot, or on losing it lists the lock and takes
// any slot free then; what frees after that list was read wakes a waiter
// that is not trying, or is counted missed and retried when the first try
// ends. So a newcomer that leaves the free slots it saw to them is woken
// if one stays free, and meanwhile does not spend a create that would
// most likely fail, and a list, on slots already spoken for. The count is
// by slot, not by waiter: a waiter may be woken for a slot its own try has
// taken meanwhile, or two wakes may name one slot.
func (w *Waiter) Sleep(free []int) bool {
	h := w.h
	h.mu.Lock()
	defer h.mu.Unlock()
	q := h.locks[w.k]
	if q == nil || w.hot || w.mine {
		return false
	}
	for _, slot := range free {
		if !slices.ContainsFunc(q.waiters, func(o *Waiter) bool { return o.hot && o.aim == slot }) {
			return false
		}
	}
	w.lost = true
	if q.missed > 0 {
		// A slot freed while the waiters were all trying, before this
		// one was queued: as after a lost try, the longest waiting tries
		// again (this one, if it is the first in line).
		q.missed--
		h.wakeLocked(w.k, -1)
	}
	return true
}

// Tried tells the hub how a try went: won, with the slot it took, or lost
// to a holder. A try that failed for another reason is not reported; the
// waiter's Done then passes its wake on.
func (w *Waiter) Tried(won bool, took int) {
	h := w.h
	h.mu.Lock()
	defer h.mu.Unlock()
	q := h.locks[w.k]
	woken := w.hot
	w.hot, w.lost = false, !won
	if q == nil {
		return
	}
	if won {
		select {
		case slot := <-w.c:
			if slot != took {
				// A wake came during this try, which took another slot
				// (or one the wake did not name): pass it on, so that a
				// slot freed meanwhile does not stay free while others
				// sleep. At worst the next try loses. The winner is kept
				// out of the choice.
				w.hot = true
				h.wakeLocked(w.k, slot)
				w.hot = false
			}
		default:
		}
	}
	if w.mine {
		w.mine = false
		if !won {
			w.signal(-1) // try again: it will answer already
		}
	}
	if q.missed > 0 {
		// A slot freed while this try (and every other) was in flight.
		q.missed--
		h.wakeLocked(w.k, -1)
		return
	}
	if woken && !won {
		h.wakeWiderLocked(w.k, w.limit)
	}
}

// Done takes the waiter out of the queue. A wake it had not used goes to
// the next waiter.
func (w *Waiter) Done() {
	h := w.h
	h.mu.Lock()
	defer h.mu.Unlock()
	q := h.locks[w.k]
	if q == nil {
		return
	}
	for i, o := range q.waiters {
		if o == w {
			q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
			h.waiting--
			break
		}
	}
	if w.hot {
		w.hot = false
		h.wakeLocked(w.k, -1)
	}
	if len(q.waiters) == 0 {
		for _, t := range q.timers {
			t.Stop()
		}
		delete(h.locks, w.k)
	}
}

// wakeLocked wakes the longest-waiting waiter of k that is not awake
// already, telling it slot. When every waiter is awake,
// the wake is counted, for the first try to end.
func (h *Hub) wakeLocked(k key, slot int) {
	q := h.locks[k]
	if q == nil {
		return
	}
	for _, w := range q.waiters {
		if w.hot {
			continue
		}
		w.signal(slot)
		return
	}
	if q.missed < len(q.waiters) {
		q.missed++
	}
}

// wakeWiderLocked wakes the longest-waiting idle waiter of k whose limit
// is above limit, if there is one. If the only wider waiters are trying
// already, their tries may have read the lock before the slot freed: the
// wake is counted as missed, so the first of them to lose tries again.
func (h *Hub) wakeWiderLocked(k key, limit int) {
	q := h.locks[k]
	trying := false
	for _, w := range q.waiters {
		if w.limit <= limit {
			continue
		}
		if !w.hot {
			w.signal(-1)
			return
		}
		trying = true
	}
	if trying && q.missed < len(q.waiters) {
		q.missed++
	}
}

func (w *Waiter) signal(slot int) {
	w.hot, w.aim = true, slot
	select {
	case w.c <- slot:
	default:
	}
}

// Gone reports a permit deleted: its slot is free.
func (h *Hub) Gone(p *locksv1alpha1.QueenLock) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := key{p.Namespace, p.Spec.Lock}
	h.notifyLocked(k)
	if q := h.locks[k]; q != nil {
		if t := q.timers[p.Name]; t != nil {
			t.Stop()
			delete(q.timers, p.Name)
		}
		h.wakeLocked(k, int(p.Spec.Slot))
	}
}

// Seen reports a permit created or written: its slot frees at its
// expireTime plus the grace, unless it is renewed or deleted first. A
// permit being deleted is as good as gone.
func (h *Hub) Seen(p *locksv1alpha1.QueenLock) {
	if !p.DeletionTimestamp.IsZero() {
		h.Gone(p)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.notifyLocked(key{p.Namespace, p.Spec.Lock})
	h.armLocked(p)
	if q := h.locks[key{p.Namespace, p.Spec.Lock}]; q != nil {
		for _, w := range q.waiters {
			if !locks.AnswersAlready(p, w.owner, w.limit) {
				continue
			}
			if w.hot {
				w.mine = true
			} else {
				w.signal(-1)
			}
		}
	}
}

func (h *Hub) armLocked(p *locksv1alpha1.QueenLock) {
	k := key{p.Namespace, p.Spec.Lock}
	q := h.locks[k]
	if q == nil || p.Spec.ExpireTime == nil {
		return
	}
	if t := q.timers[p.Name]; t != nil {
		t.Stop()
	}
	name, slot := p.Name, int(p.Spec.Slot)
	q.timers[name] = time.AfterFunc(time.Until(p.Spec.ExpireTime.Add(h.grace)), func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if q := h.locks[k]; q != nil {
			delete(q.timers, name)
			h.wakeLocked(k, slot)
		}
	})
}

// Asleep is how many waiters have lost a try and wait for a wake now,
// or wait in their lock's line.
func (h *Hub) Asleep() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, q := range h.locks {
		for _, w := range q.waiters {
			if w.lost && !w.hot {
				n++
			}
		}
	}
	for _, fs := range h.follows {
		for f := range fs {
			if f.queued {
				n++
			}
		}
	}
	return n
}

// Waiting is how many calls wait now.
func (h *Hub) Waiting() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.waiting
}
