package dashboard

import (
	"encoding/json"
	"sort"
	"sync"
	"time"
)

// The kinds of rows the page shows. A waiter is anything in a lock's line:
// today the gated pods; the line's own waiters join as another source of
// the same kind.
const (
	kindPermit  = "permit"
	kindWaiter  = "waiter"
	kindGuarded = "guarded"
)

// Source states, as the page shows them.
const (
	stateConnecting = "connecting"
	stateLive       = "live"
	stateBroken     = "broken"    // the watch failed; it is being made again
	stateForbidden  = "forbidden" // the caller may not list this: nothing of it is shown
)

// status is one source's health.
type status struct {
	Source  string    `json:"source"`
	Kind    string    `json:"kind"`
	State   string    `json:"state"`
	Message string    `json:"message,omitempty"`
	Since   time.Time `json:"since"`
}

// row is one thing the page shows, keyed within its kind.
type row interface{ key() string }

// access is what the caller may release: a namespace where deleting any
// permit is allowed, or single permits where only they are.
type access struct {
	// Checked is false until the first reviews have answered.
	Checked    bool            `json:"checked"`
	Namespaces map[string]bool `json:"namespaces"`
	Permits    map[string]bool `json:"permits"` // "namespace/name"
}

// hub holds what the sources have seen and sends every change to each
// open page as a server-sent event. A page that connects gets the whole
// state first, in the same step that subscribes it, so it misses nothing
// and sees nothing twice.
type hub struct {
	scope string

	mu      sync.Mutex
	rows    map[string]map[string]row // kind -> key -> row
	sources map[string]*status        // by source name
	access  access
	subs    map[*sub]struct{}
	closed  bool
	// kick wakes the access checker when permits of new names or
	// namespaces appear.
	kick chan struct{}
}

// sub is one open event stream. Its queue is bounded: a page that reads
// too slowly is dropped and, reconnecting, gets the whole state again.
type sub struct {
	ch   chan []byte
	gone chan struct{}
	once sync.Once
}

func (s *sub) drop() { s.once.Do(func() { close(s.gone) }) }

const subQueue = 4096

func newHub(scope string) *hub {
	return &hub{
		scope:   scope,
		rows:    map[string]map[string]row{kindPermit: {}, kindWaiter: {}, kindGuarded: {}},
		sources: map[string]*status{},
		access:  access{Namespaces: map[string]bool{}, Permits: map[string]bool{}},
		subs:    map[*sub]struct{}{},
		kick:    make(chan struct{}, 1),
	}
}

// event encodes one server-sent event.
func event(name string, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(`{}`)
	}
	out := make([]byte, 0, len(name)+len(b)+16)
	out = append(out, "event: "...)
	out = append(out, name...)
	out = append(out, "\ndata: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}

// broadcast sends msg to every page; the caller holds mu.
func (h *hub) broadcast(msg []byte) {
	for s := range h.subs {
		select {
		case s.ch <- msg:
		default:
			delete(h.subs, s)
			s.drop()
		}
	}
}

func (h *hub) kickAccess() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

type upsertMsg struct {
	Kind string `json:"kind"`
	Row  row    `json:"row"`
}

type deleteMsg struct {
	Kind string `json:"kind"`
	Key  string `json:"key"`
}

type resetMsg struct {
	Kind   string `json:"kind"`
	Source string `json:"source"`
	Rows   []row  `json:"rows"`
}

// upsert records a row of a source and tells every page.
func (h *hub) upsert(kind string, r row) {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, known := h.rows[kind][r.key()]
	h.rows[kind][r.key()] = r
	h.broadcast(event("upsert", upsertMsg{Kind: kind, Row: r}))
	if kind == kindPermit && !known {
		h.kickAccess()
	}
}

func (h *hub) remove(kind, key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.rows[kind][key]; !ok {
		return
	}
	delete(h.rows[kind], key)
	h.broadcast(event("delete", deleteMsg{Kind: kind, Key: key}))
}

// reset replaces the rows a source had with what a fresh list answered.
// Rows of the same kind from other sources (ConfigMaps and Secrets are
// both guarded objects) are kept: owns says which rows are the source's.
func (h *hub) reset(kind, source string, owns func(row) bool, rows []row) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.rows[kind]
	for k, r := range m {
		if owns(r) {
			delete(m, k)
		}
	}
	for _, r := range rows {
		m[r.key()] = r
	}
	all := make([]row, 0, len(m))
	for _, r := range m {
		all = append(all, r)
	}
	sortRows(all)
	h.broadcast(event("reset", resetMsg{Kind: kind, Source: source, Rows: all}))
	if kind == kindPermit {
		h.kickAccess()
	}
}

func sortRows(rs []row) { sort.Slice(rs, func(i, j int) bool { return rs[i].key() < rs[j].key() }) }

// setStatus records a source's health and tells every page when it
// changed.
func (h *hub) setStatus(st status) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if old, ok := h.sources[st.Source]; ok && old.State == st.State && old.Message == st.Message {
		return
	}
	st.Since = time.Now().UTC()
	h.sources[st.Source] = &st
	h.broadcast(event("status", st))
}

// setAccess records what the caller may release.
func (h *hub) setAccess(a access) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.access = a
	h.broadcast(event("access", a))
}

// permitKeys answers the namespaces and names of the permits known now,
// for the access checker.
func (h *hub) permitKeys() map[string][]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string][]string{}
	for _, r := range h.rows[kindPermit] {
		p := r.(*permitRow)
		out[p.Namespace] = append(out[p.Namespace], p.Name)
	}
	return out
}

// snapshotMsg is the whole state, the first event of every stream.
type snapshotMsg struct {
	Scope   string    `json:"scope"` // a namespace, or "" for all
	Sources []*status `json:"sources"`
	Permits []row     `json:"permits"`
	Waiters []row     `json:"waiters"`
	Guarded []row     `json:"guarded"`
	Access  access    `json:"access"`
}

// subscribe answers the snapshot event and a stream of what follows it.
func (h *hub) subscribe() (*sub, []byte, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, nil, false
	}
	snap := snapshotMsg{Scope: h.scope, Access: h.access}
	for _, st := range h.sources {
		snap.Sources = append(snap.Sources, st)
	}
	sort.Slice(snap.Sources, func(i, j int) bool { return snap.Sources[i].Source < snap.Sources[j].Source })
	collect := func(kind string) []row {
		rs := make([]row, 0, len(h.rows[kind]))
		for _, r := range h.rows[kind] {
			rs = append(rs, r)
		}
		sortRows(rs)
		return rs
	}
	snap.Permits, snap.Waiters, snap.Guarded = collect(kindPermit), collect(kindWaiter), collect(kindGuarded)
	s := &sub{ch: make(chan []byte, subQueue), gone: make(chan struct{})}
	h.subs[s] = struct{}{}
	return s, event("snapshot", snap), true
}

func (h *hub) unsubscribe(s *sub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, s)
}

// close ends every stream: the server is stopping.
func (h *hub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for s := range h.subs {
		s.drop()
	}
	h.subs = map[*sub]struct{}{}
}
