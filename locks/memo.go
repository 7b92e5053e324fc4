package locks

import (
	"sync"
)

// memo remembers the last version of each permit this client answered, so
// that a release of that version needs no read to tell whether its
// lifetime had ended. It holds one entry per permit and is bounded: when
// full it starts over, which costs reads, never a wrong answer. It never
// decides whether a stale token is carried through: the permit's
// firstToken does, the same on every replica (see current).
type memo struct {
	mu  sync.Mutex
	max int
	m   map[memoKey]memoEntry
}

type memoKey struct{ ns, name string }

type memoEntry struct {
	rv string
	v  Version
}

func newMemo(max int) *memo { return &memo{max: max, m: map[memoKey]memoEntry{}} }

func (m *memo) put(ns, name, rv string, v Version) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.m) >= m.max {
		clear(m.m)
	}
	m.m[memoKey{ns, name}] = memoEntry{rv: rv, v: v}
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
