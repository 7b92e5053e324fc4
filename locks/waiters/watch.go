package waiters

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// Watcher wakes a waiting acquire of a process that talks to the
// Kubernetes API itself (the Go handle's direct transport): each waiter
// watches the permits of its own lock, for as long as it waits.
type Watcher struct {
	C     client.WithWatch
	Grace time.Duration
}

// Wait starts a watch of the lock's permits; it never refuses.
func (w Watcher) Wait(ns, lock, owner string, limit int) (locks.Waiter, bool) {
	h := NewHub(1, w.Grace, nil)
	waiter, _ := h.Wait(ns, lock, owner, limit)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for ctx.Err() == nil {
			var list locksv1alpha1.QueenLockList
			wi, err := w.C.Watch(ctx, &list, client.InNamespace(ns), client.MatchingLabels{permit.LockLabel: permit.LabelValue(lock)})
			if err != nil {
				if !sleep(ctx, time.Second) {
					return
				}
				continue
			}
			for ev := range wi.ResultChan() {
				p, ok := ev.Object.(*locksv1alpha1.QueenLock)
				if !ok || p.Spec.Lock != lock {
					continue
				}
				if ev.Type == watch.Deleted {
					h.Gone(p)
				} else {
					h.Seen(p)
				}
			}
			wi.Stop()
		}
	}()
	return stopping{Waiter: waiter, stop: cancel}, true
}

type stopping struct {
	locks.Waiter
	stop context.CancelFunc
}

func (s stopping) Done() { s.stop(); s.Waiter.Done() }

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
