package locks

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// WaiterTTL is how long a waiter outlives its carrier's last renew before
// any replica removes it: a dead carrier holds the line no longer. The
// carrier renews every third of it.
const WaiterTTL = 6 * time.Second

// WithCarrier names, on the waiters this Client puts in a line, what
// carries them (a route replica, a process): for people reading the line.
func WithCarrier(carrier string) Option { return func(l *Client) { l.carrier = carrier } }

// CountsWaiting makes an acquire that answers held, and Get, also read how
// many wait in the lock's line: one more read (a list of the lock's
// waiters) on each.
func CountsWaiting() Option { return func(l *Client) { l.countWaiting = true } }

// place is a waiter's object in the line, kept alive while it waits.
type place struct {
	l     *Client
	a     *acquire
	moved chan struct{} // signalled when the object was replaced

	mu   sync.Mutex
	name string
	uid  types.UID
	pos  uint64

	stop chan struct{}
	done chan struct{}
}

// join puts a in its lock's line: a create of a QueenLockWaiter, whose
// resourceVersion is its place. A goroutine renews it every third of
// WaiterTTL until leave.
func (l *Client) join(ctx context.Context, a *acquire) (*place, error) {
	p := &place{l: l, a: a, moved: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if err := p.create(ctx); err != nil {
		return nil, err
	}
	go p.renew()
	return p, nil
}

func (p *place) create(ctx context.Context) error {
	a := p.a
	now := metav1.NewMicroTime(p.l.clock.Now())
	w := &locksv1alpha1.QueenLockWaiter{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    a.ns,
			GenerateName: waiterPrefix(a.lock),
			Labels:       map[string]string{permit.LockLabel: permit.LabelValue(a.lock)},
		},
		Spec: locksv1alpha1.QueenLockWaiterSpec{
			Lock: a.lock, Owner: a.owner, Limit: int32(max(a.limit, 1)),
			TTLSeconds: int32(WaiterTTL / time.Second), Carrier: p.l.carrier,
			Since: &now, RenewTime: &now,
		},
	}
	if err := p.l.c.Create(ctx, w); err != nil {
		return fmt.Errorf("joining the line of lock %q: %w", a.lock, err)
	}
	pos, err := permit.Token(w.ResourceVersion)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.name, p.uid, p.pos = w.Name, w.UID, pos
	p.mu.Unlock()
	return nil
}

// key answers the waiter's place, and whether ws (a watch's line) has
// seen its object: only then has the watch seen every waiter ahead of it.
func (p *place) key(ws []locksv1alpha1.QueenLockWaiter) (uint64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range ws {
		if ws[i].Name == p.name {
			return p.pos, true
		}
	}
	return p.pos, false
}

// renew keeps the waiter alive, recording its place at the first renew.
// A waiter removed meanwhile (its renews did not get through for
// WaiterTTL, so a replica judged its carrier gone) joins again, at the
// end of the line: the place it had is lost.
func (p *place) renew() {
	defer close(p.done)
	t := time.NewTicker(WaiterTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), WaiterTTL/3)
		p.mu.Lock()
		name, uid, pos := p.name, p.uid, p.pos
		p.mu.Unlock()
		now := p.l.clock.Now().UTC().Format(metav1.RFC3339Micro)
		body := fmt.Sprintf(`{"metadata":{"uid":%q},"spec":{"position":%d,"renewTime":%q}}`, uid, pos, now)
		w := &locksv1alpha1.QueenLockWaiter{ObjectMeta: metav1.ObjectMeta{Namespace: p.a.ns, Name: name}}
		err := p.l.c.Patch(ctx, w, client.RawPatch(types.MergePatchType, []byte(body)))
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			if p.create(ctx) == nil {
				select {
				case p.moved <- struct{}{}:
				default:
				}
			}
		}
		cancel()
	}
}

// leave takes the waiter out of the line: its renews stop and its object
// is deleted. Should the delete fail, any replica removes it within
// WaiterTTL.
func (p *place) leave() {
	close(p.stop)
	<-p.done
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p.mu.Lock()
	name, uid := p.name, p.uid
	p.mu.Unlock()
	w := &locksv1alpha1.QueenLockWaiter{ObjectMeta: metav1.ObjectMeta{Namespace: p.a.ns, Name: name}}
	_ = p.l.c.Delete(ctx, w, client.Preconditions{UID: &uid})
}

// waiterPrefix is the generateName of a lock's waiters: readable, and a
// valid object name whatever the lock's name.
func waiterPrefix(lock string) string {
	s := strings.TrimSuffix(permit.Name(lock, 0), ".0")
	if len(s) > 50 {
		s = s[:50]
	}
	return strings.TrimRight(s, ".-") + "-"
}

// Waiting is how many wait in the line of lock in ns, read from the API
// server.
func (l *Client) Waiting(ctx context.Context, ns, lock string) (int, error) {
	ws, err := l.Line(ctx, ns, lock)
	return len(ws), err
}

// Line reads the line of lock in ns from the API server, in its order.
func (l *Client) Line(ctx context.Context, ns, lock string) ([]locksv1alpha1.QueenLockWaiter, error) {
	var list locksv1alpha1.QueenLockWaiterList
	if err := l.c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{permit.LockLabel: permit.LabelValue(lock)}); err != nil {
		return nil, fmt.Errorf("reading the line of lock %q: %w", lock, err)
	}
	var ws []locksv1alpha1.QueenLockWaiter
	for _, w := range list.Items {
		if w.Spec.Lock == lock && w.DeletionTimestamp.IsZero() {
			ws = append(ws, w)
		}
	}
	SortLine(ws)
	return ws, nil
}

// SortLine puts waiters in their line's order.
func SortLine(ws []locksv1alpha1.QueenLockWaiter) {
	keys := make(map[string]uint64, len(ws))
	for i := range ws {
		keys[ws[i].Name] = LineKey(&ws[i])
	}
	slices.SortFunc(ws, func(a, b locksv1alpha1.QueenLockWaiter) int {
		return cmp.Or(cmp.Compare(keys[a.Name], keys[b.Name]), cmp.Compare(a.Name, b.Name))
	})
}
