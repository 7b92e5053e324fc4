package handle

import (
	"context"
	"os"
	"time"

	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/locks/waiters"
)

// Transport carries lock operations to the server. HTTP goes through the
// route; Kube goes straight to the Kubernetes API with the same locks
// package the route runs, so both behave alike.
type Transport interface {
	Acquire(ctx context.Context, name, owner string, ttlSeconds int64, limit int) (locks.Acquired, error)
	Renew(ctx context.Context, name string, slot int, token uint64, owner string, ttlSeconds int64) (locks.Renewed, error)
	Release(ctx context.Context, name string, slot int, token uint64, owner string) (bool, error)
	Get(ctx context.Context, name string) ([]locks.Holder, error)
	Check(ctx context.Context, name string, slot int, expect uint64) (bool, error)
	// Namespace is where the locks live, for guards; "" when the server
	// decides (the route with a ServiceAccount token).
	Namespace() string
}

// Kube is the direct transport: lock operations as Kubernetes writes in one
// namespace. c must read from the API server, not from an informer cache.
func Kube(c client.Client, namespace string) Transport {
	k := &kube{l: locks.New(c, clock.RealClock{}), ns: namespace}
	if w, ok := c.(client.WithWatch); ok {
		k.waker = waiters.Watcher{C: w}
	}
	return k
}

type kube struct {
	l     *locks.Client
	ns    string
	waker locks.Waker // nil when the client cannot watch
}

// WaitingTransport is a transport whose acquire can wait for a slot to free
// and be woken when one does, instead of being asked again and again. Both
// transports of this package are; Kube can wait only when its client can
// watch.
type WaitingTransport interface {
	// AcquireWaiting is Acquire, waiting up to wait while the lock is held.
	// ok is false when this transport cannot wait (the caller then polls).
	AcquireWaiting(ctx context.Context, name, owner string, ttlSeconds int64, limit int, wait time.Duration) (a locks.Acquired, ok bool, err error)
}

func (k *kube) AcquireWaiting(ctx context.Context, name, owner string, ttl int64, limit int, wait time.Duration) (locks.Acquired, bool, error) {
	if k.waker == nil {
		return locks.Acquired{}, false, nil
	}
	a, err := k.l.Acquire(ctx, k.ns, name, owner, ttl, limit, k.pod(), locks.WaitUpTo(wait, k.waker))
	return a, true, err
}

// pod is the holder pod the downward API names, if any.
func (k *kube) pod() locks.AcquireOption {
	return locks.HolderPod(os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME"), os.Getenv("POD_UID"))
}

func (k *kube) Acquire(ctx context.Context, name, owner string, ttl int64, limit int) (locks.Acquired, error) {
	return k.l.Acquire(ctx, k.ns, name, owner, ttl, limit, k.pod())
}

func (k *kube) Renew(ctx context.Context, name string, slot int, token uint64, owner string, ttl int64) (locks.Renewed, error) {
	return k.l.Renew(ctx, k.ns, name, slot, token, owner, ttl)
}

func (k *kube) Release(ctx context.Context, name string, slot int, token uint64, owner string) (bool, error) {
	return k.l.Release(ctx, k.ns, name, slot, token, owner)
}

func (k *kube) Get(ctx context.Context, name string) ([]locks.Holder, error) {
	return k.l.Get(ctx, k.ns, name)
}

func (k *kube) Check(ctx context.Context, name string, slot int, expect uint64) (bool, error) {
	return k.l.Check(ctx, k.ns, name, slot, expect)
}

func (k *kube) Namespace() string { return k.ns }
