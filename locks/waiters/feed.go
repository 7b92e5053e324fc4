package waiters

import (
	"context"
	"fmt"
	"time"

	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// DefaultMaxWaiters bounds the calls one replica keeps waiting at once.
const DefaultMaxWaiters = 1000

// ForManager makes a hub fed by the manager's informer of permits, which
// every replica runs (the route serves on every replica, not only on the
// leader), and adds the feed to the manager.
func ForManager(mgr manager.Manager, grace time.Duration, max int) (*Hub, error) {
	c := mgr.GetCache()
	h := NewHub(max, grace, func(ns, lock string) []locksv1alpha1.QueenLock {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var list locksv1alpha1.QueenLockList
		if err := c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{permit.LockLabel: permit.LabelValue(lock)}); err != nil {
			return nil
		}
		return list.Items
	})
	h.ready.Store(false) // until the feed is registered and synced
	if err := mgr.Add(feed{h: h, c: c}); err != nil {
		return nil, fmt.Errorf("adding the wake-up feed: %w", err)
	}
	h.line = func(ns, lock string) []locksv1alpha1.QueenLockWaiter {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var list locksv1alpha1.QueenLockWaiterList
		if err := c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{permit.LockLabel: permit.LabelValue(lock)}); err != nil {
			return nil
		}
		return list.Items
	}
	if err := mgr.Add(lineFeed{h: h, c: c}); err != nil {
		return nil, fmt.Errorf("adding the line's feed: %w", err)
	}
	return h, nil
}

// lineFeed tells the hub of every change of a waiter, on every replica.
type lineFeed struct {
	h *Hub
	c cache.Cache
}

func (f lineFeed) NeedLeaderElection() bool { return false }

func (f lineFeed) Start(ctx context.Context) error {
	inf, err := f.c.GetInformer(ctx, &locksv1alpha1.QueenLockWaiter{})
	if err != nil {
		// A cluster whose CRDs predate the line: the route still serves,
		// and waiting calls wait outside a line, as they did before it.
		logf.FromContext(ctx).Error(err, "no line for waiting calls: the waiters' resource cannot be watched")
		f.h.lineDown.Store(true)
		<-ctx.Done()
		return nil
	}
	changed := func(obj any) {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if w, ok := obj.(*locksv1alpha1.QueenLockWaiter); ok {
			f.h.LineChanged(w)
		}
	}
	// A renew changes no place in the line: only waiters that join or
	// leave wake the calls that follow the lock, so that many waiters
	// renewing do not keep every one of them looking at the line.
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    changed,
		DeleteFunc: changed,
	})
	if err != nil {
		return fmt.Errorf("watching the lines of locks: %w", err)
	}
	if toolscache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		f.h.lineReady.Store(true)
	}
	<-ctx.Done()
	_ = inf.RemoveEventHandler(reg)
	return nil
}

type feed struct {
	h *Hub
	c cache.Cache
}

// NeedLeaderElection is false: every replica's waiters need waking.
func (f feed) NeedLeaderElection() bool { return false }

func (f feed) Start(ctx context.Context) error {
	inf, err := f.c.GetInformer(ctx, &locksv1alpha1.QueenLock{})
	if err != nil {
		return fmt.Errorf("watching permits for waiters: %w", err)
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if p, ok := obj.(*locksv1alpha1.QueenLock); ok {
				f.h.Seen(p)
			}
		},
		UpdateFunc: func(_, obj any) {
			if p, ok := obj.(*locksv1alpha1.QueenLock); ok {
				f.h.Seen(p)
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*locksv1alpha1.QueenLock); ok {
				f.h.Gone(p)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching permits for waiters: %w", err)
	}
	// Waiters may sleep on the cache only once every permit in it has
	// been reported to the hub: before, a permit deleted from the cache
	// would wake nobody.
	if toolscache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		f.h.ready.Store(true)
	}
	<-ctx.Done()
	_ = inf.RemoveEventHandler(reg)
	return nil
}
