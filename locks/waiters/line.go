package waiters

import (
	"context"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// LineLister lists the waiters of a lock as a watch's cache has them.
type LineLister func(ns, lock string) []locksv1alpha1.QueenLockWaiter

// follow is one waiting acquire of the hub following its lock.
type follow struct {
	h *Hub
	k key
	c chan struct{}
	// queued is set once the acquire waits in the line (under h.mu).
	queued bool
}

// Queued tells the hub that the acquire lost its first try and waits in
// the line: Asleep counts it.
func (f *follow) Queued() {
	f.h.mu.Lock()
	f.queued = true
	f.h.mu.Unlock()
}

// Follow lets a waiting acquire take its turn in its lock's line, read
// from the manager's caches of permits and waiters. It answers false when
// the hub has no cache of waiters, its caches are not synced yet, or as
// many calls wait as it allows.
func (h *Hub) Follow(ns, lock string) (locks.Follow, bool) {
	if h.line == nil || h.lister == nil || !h.synced() {
		return nil, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiting >= h.max {
		return nil, false
	}
	h.waiting++
	k := key{ns, lock}
	f := &follow{h: h, k: k, c: make(chan struct{}, 1)}
	if h.follows[k] == nil {
		h.follows[k] = map[*follow]struct{}{}
	}
	h.follows[k][f] = struct{}{}
	return f, true
}

// synced waits, for a manager that is starting, until its caches of
// permits and waiters have synced: a waiter that fell back to waiting
// unordered would take no place in the line. It gives up after
// syncTimeout.
func (h *Hub) synced() bool {
	deadline := time.Now().Add(syncTimeout)
	for !h.lineReady.Load() || !h.ready.Load() {
		if h.lineDown.Load() || time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

const syncTimeout = 30 * time.Second

func (f *follow) C() <-chan struct{} { return f.c }

func (f *follow) Permits() []locksv1alpha1.QueenLock { return f.h.lister(f.k.ns, f.k.lock) }

func (f *follow) Line() ([]locksv1alpha1.QueenLockWaiter, bool) {
	return f.h.line(f.k.ns, f.k.lock), true
}

func (f *follow) Stop() {
	h := f.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if fs := h.follows[f.k]; fs != nil {
		if _, ok := fs[f]; ok {
			delete(fs, f)
			h.waiting--
		}
		if len(fs) == 0 {
			delete(h.follows, f.k)
		}
	}
}

// LineChanged reports a waiter of a lock created, renewed or removed.
func (h *Hub) LineChanged(w *locksv1alpha1.QueenLockWaiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.notifyLocked(key{w.Namespace, w.Spec.Lock})
}

// notifyLocked signals every acquire following k.
func (h *Hub) notifyLocked(k key) {
	for f := range h.follows[k] {
		select {
		case f.c <- struct{}{}:
		default:
		}
	}
}

// Follow lets a waiting acquire of a process over the Kubernetes API take
// its turn in its lock's line: it watches the lock's permits and waiters
// for as long as it waits.
func (w Watcher) Follow(ns, lock string) (locks.Follow, bool) {
	ctx, cancel := context.WithCancel(context.Background())
	f := &watchFollow{c: make(chan struct{}, 1), stop: cancel,
		permits: store[locksv1alpha1.QueenLock]{m: map[string]locksv1alpha1.QueenLock{}},
		waiters: store[locksv1alpha1.QueenLockWaiter]{m: map[string]locksv1alpha1.QueenLockWaiter{}},
	}
	sel := []client.ListOption{client.InNamespace(ns), client.MatchingLabels{permit.LockLabel: permit.LabelValue(lock)}}
	go keep(ctx, w.C, sel, func(bool) { f.signal() }, &f.permits, func() client.ObjectList { return &locksv1alpha1.QueenLockList{} },
		func(l client.ObjectList) []locksv1alpha1.QueenLock { return l.(*locksv1alpha1.QueenLockList).Items })
	go keep(ctx, w.C, sel, f.signalLine, &f.waiters, func() client.ObjectList { return &locksv1alpha1.QueenLockWaiterList{} },
		func(l client.ObjectList) []locksv1alpha1.QueenLockWaiter {
			return l.(*locksv1alpha1.QueenLockWaiterList).Items
		})
	return f, true
}

type watchFollow struct {
	c       chan struct{}
	stop    context.CancelFunc
	permits store[locksv1alpha1.QueenLock]
	waiters store[locksv1alpha1.QueenLockWaiter]
}

func (f *watchFollow) C() <-chan struct{} { return f.c }
func (f *watchFollow) Stop()              { f.stop() }

// signalLine signals a change of the line: a waiter that joined or left,
// not one renewed (modified is true), which changes no place.
func (f *watchFollow) signalLine(modified bool) {
	if !modified {
		f.signal()
	}
}

func (f *watchFollow) signal() {
	select {
	case f.c <- struct{}{}:
	default:
	}
}

func (f *watchFollow) Permits() []locksv1alpha1.QueenLock {
	ps, _ := f.permits.items()
	return ps
}

// Line answers false until both watches have listed: a waiter that saw
// the line but not yet the permits would take every slot for free.
func (f *watchFollow) Line() ([]locksv1alpha1.QueenLockWaiter, bool) {
	ws, listed := f.waiters.items()
	_, permitsListed := f.permits.items()
	return ws, listed && permitsListed
}

// store is what one watch has seen of one kind, by name.
type store[T any] struct {
	mu     sync.Mutex
	m      map[string]T
	listed bool
}

func (s *store[T]) items() ([]T, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]T, 0, len(s.m))
	for _, v := range s.m {
		out = append(out, v)
	}
	return out, s.listed
}

// keep lists the objects sel selects into s, then follows them with a
// watch from that list's version, listing again whenever the watch ends,
// until ctx ends. Every change signals, saying whether it was a
// modification.
func keep[T any](ctx context.Context, c client.WithWatch, sel []client.ListOption, signal func(modified bool), s *store[T],
	newList func() client.ObjectList, items func(client.ObjectList) []T,
) {
	for ctx.Err() == nil {
		list := newList()
		if err := c.List(ctx, list, sel...); err != nil {
			if !sleep(ctx, time.Second) {
				return
			}
			continue
		}
		s.mu.Lock()
		s.m = map[string]T{}
		for _, it := range items(list) {
			var o any = &it
			s.m[o.(client.Object).GetName()] = it
		}
		s.listed = true
		s.mu.Unlock()
		signal(false)
		opts := append([]client.ListOption{&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.GetResourceVersion()}}}, sel...)
		wi, err := c.Watch(ctx, newList(), opts...)
		if err != nil {
			if !sleep(ctx, time.Second) {
				return
			}
			continue
		}
		for ev := range wi.ResultChan() {
			o, ok := ev.Object.(client.Object)
			if !ok || ev.Type == watch.Error || ev.Type == watch.Bookmark {
				continue
			}
			it, ok := any(o).(*T)
			if !ok {
				continue
			}
			s.mu.Lock()
			if ev.Type == watch.Deleted {
				delete(s.m, o.GetName())
			} else {
				s.m[o.GetName()] = *it
			}
			s.mu.Unlock()
			signal(ev.Type == watch.Modified)
		}
		wi.Stop()
	}
}
