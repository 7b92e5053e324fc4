// Package wake wakes acquires that wait for a permit of a lock to free: on
// the delete of a permit, and when a permit reaches its expireTime plus the
// skew grace, as a watch of permits reports them. Waiting costs the API
// server nothing while nothing changes.
//
// Waking does not stampede. Each free slot wakes one waiter, the one that
// has waited longest on this replica; only if its try does not win is the
// next one woken (its limit may not reach the slot that freed, say).
// Across replicas there is no order: each wakes its own waiters.
package wake

import (
	"sync"
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

	mu      sync.Mutex
	waiting int
	locks   map[key]*queue
}

type key struct{ ns, lock string }

// queue is the waiters of one lock, longest waiting first, and a timer per
// permit of the lock that fires at its expireTime plus the grace.
type queue struct {
	waiters []*Waiter
	timers  map[string]*time.Timer // by permit name
}

// NewHub makes a hub that lets at most max calls wait at once. lister may
// be nil: then only events after a waiter arrived arm expiry timers.
func NewHub(max int, grace time.Duration, lister Lister) *Hub {
	return &Hub{max: max, grace: grace, lister: lister, locks: map[key]*queue{}}
}

// Waiter is one waiting acquire.
type Waiter struct {
	h   *Hub
	k   key
	c   chan struct{}
	hot bool // woken, and has not yet said how its try went
}

// C is signalled when a slot may have freed: try to acquire, then call
// Tried.
func (w *Waiter) C() <-chan struct{} { return w.c }

// Wait queues a waiter for lock in ns. It answers false when the replica
// already has as many waiting calls as it allows: the caller then answers
// at once, as without a wait.
func (h *Hub) Wait(ns, lock string) (locks.Waiter, bool) {
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
	w := &Waiter{h: h, k: k, c: make(chan struct{}, 1)}
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

// Tried tells the hub how the try after a wake went. A waiter that did not
// win passes the wake on to the next waiter, and waits again.
func (w *Waiter) Tried(won bool) {
	h := w.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if !w.hot {
		return
	}
	w.hot = false
	if !won {
		h.wakeLocked(w.k, w)
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
		h.wakeLocked(w.k, nil)
	}
	if len(q.waiters) == 0 {
		for _, t := range q.timers {
			t.Stop()
		}
		delete(h.locks, w.k)
	}
}

// wakeLocked wakes the longest-waiting waiter of k that is not awake
// already and is not skip.
func (h *Hub) wakeLocked(k key, skip *Waiter) {
	q := h.locks[k]
	if q == nil {
		return
	}
	for _, w := range q.waiters {
		if w.hot || w == skip {
			continue
		}
		w.hot = true
		select {
		case w.c <- struct{}{}:
		default:
		}
		return
	}
}

// Gone reports a permit deleted: its slot is free.
func (h *Hub) Gone(p *locksv1alpha1.QueenLock) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := key{p.Namespace, p.Spec.Lock}
	if q := h.locks[k]; q != nil {
		if t := q.timers[p.Name]; t != nil {
			t.Stop()
			delete(q.timers, p.Name)
		}
		h.wakeLocked(k, nil)
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
	h.armLocked(p)
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
	name := p.Name
	q.timers[name] = time.AfterFunc(time.Until(p.Spec.ExpireTime.Add(h.grace)), func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if q := h.locks[k]; q != nil {
			delete(q.timers, name)
			h.wakeLocked(k, nil)
		}
	})
}

// Waiting is how many calls wait now.
func (h *Hub) Waiting() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.waiting
}
