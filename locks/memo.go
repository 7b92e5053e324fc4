package locks

import (
	"slices"
	"sync"
	"time"
)

// memo remembers the last version of each permit this client answered, so
// that a release of that version needs no read to tell whether its
// lifetime had ended, and the earlier versions of the same holding it
// answered, so that a stale token is carried through only within one
// holding. It holds one entry per permit and is bounded: when full it
// starts over, which costs reads, or a lost answer to a stale token, never
// a wrong token.
type memo struct {
	mu  sync.Mutex
	max int
	m   map[memoKey]memoEntry
}

type memoKey struct{ ns, name string }

type memoEntry struct {
	rv      string
	v       Version
	since   time.Time // acquireTime of the holding
	earlier []string  // earlier versions of that holding, newest last
}

// maxEarlier bounds the versions kept per holding: a holder whose answers
// were lost more often than this in a row gets lost, and acquires again.
const maxEarlier = 16

func newMemo(max int) *memo { return &memo{max: max, m: map[memoKey]memoEntry{}} }

func (m *memo) put(ns, name, rv string, v Version, since time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.m) >= m.max {
		clear(m.m)
	}
	k := memoKey{ns, name}
	e := memoEntry{rv: rv, v: v, since: since}
	if old, ok := m.m[k]; ok && old.since.Equal(since) && old.rv != rv {
		e.earlier = append(old.earlier, old.rv)
		if len(e.earlier) > maxEarlier {
			e.earlier = e.earlier[len(e.earlier)-maxEarlier:]
		}
	}
	m.m[k] = e
}

// sameHolding tells whether rv is a version this client answered of the
// holding that began at since.
func (m *memo) sameHolding(ns, name, rv string, since time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.m[memoKey{ns, name}]
	return ok && e.since.Equal(since) && (e.rv == rv || slices.Contains(e.earlier, rv))
}

// get answers the version only when rv is the one remembered.
func (m *memo) get(ns, name, rv string) (Version, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.m[memoKey{ns, name}]
	if !ok || e.rv != rv {
		return Version{}, false
	}
	return e.v, true
}

func (m *memo) forget(ns, name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, memoKey{ns, name})
}
