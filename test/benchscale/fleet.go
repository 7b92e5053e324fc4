package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// holderSA is the ServiceAccount of the holder pods in each namespace:
// the API server's ServiceAccount admission wants it to exist.
const holderSA = "holder"

// holder is one held permit and the pod that holds it.
type holder struct {
	ns, pod, lock string
	uid           types.UID
}

// fleet is the permits held, each by a pod of its own, spread evenly over
// the namespaces: permit i lives in namespace i mod namespaces, with its
// pod.
type fleet struct {
	cs      kubernetes.Interface // admin, no client-side rate limit
	c       client.Client        // the same, for the locks library
	locks   *locks.Client
	nNS     int
	workers int
	ttl     int64
	held    []holder
}

func nsName(i int) string { return fmt.Sprintf("scale-%04d", i) }

// usedNS is how many namespaces hold permits now.
func (f *fleet) usedNS() int { return max(1, min(len(f.held), f.nNS)) }

// spread is the namespace of the j-th of n samples, evenly over the
// namespaces that hold permits.
func (f *fleet) spread(j, n int) string { return nsName(j * f.usedNS() / n) }

// parallel runs do for i in [from, to) on workers goroutines, and stops at
// the first error.
func parallel(ctx context.Context, workers, from, to int, do func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	next.Store(int64(from))
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= to {
					return
				}
				if err := do(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}

// makeNamespaces creates the namespaces and their holder ServiceAccounts.
func (f *fleet) makeNamespaces(ctx context.Context) error {
	return parallel(ctx, f.workers, 0, f.nNS, func(ctx context.Context, i int) error {
		ns := nsName(i)
		if _, err := f.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating namespace %s: %w", ns, err)
		}
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: holderSA}}
		if _, err := f.cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating ServiceAccount %s/%s: %w", ns, holderSA, err)
		}
		return nil
	})
}

// grow creates pods and permits until n are held.
func (f *fleet) grow(ctx context.Context, n int) error {
	from := len(f.held)
	if n <= from {
		return nil
	}
	f.held = append(f.held, make([]holder, n-from)...)
	var done atomic.Int64
	err := parallel(ctx, f.workers, from, n, func(ctx context.Context, i int) error {
		h := holder{ns: nsName(i % f.nNS), pod: fmt.Sprintf("holder-%d", i), lock: fmt.Sprintf("held-%d", i)}
		var err error
		if h.uid, err = f.hold(ctx, h.ns, h.pod, h.lock); err != nil {
			return err
		}
		f.held[i] = h
		if d := done.Add(1); d%1000 == 0 {
			fmt.Fprintf(os.Stderr, "  %d of %d permits held\n", from+int(d), n)
		}
		return nil
	})
	if err != nil {
		f.held = f.held[:from] // what this step added is not counted as held
	}
	return err
}

// hold creates a pod (an object only: no kubelet runs it, it stays
// Pending) and takes lock for it, as an admin through the locks library,
// naming the pod as the permit's holder.
func (f *fleet) hold(ctx context.Context, ns, pod, lock string) (types.UID, error) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod},
		Spec: corev1.PodSpec{ServiceAccountName: holderSA, AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "job", Image: "job"}}}}
	p, err := f.cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("creating pod %s/%s: %w", ns, pod, err)
	}
	a, err := f.locks.Acquire(ctx, ns, lock, "owner-"+pod, f.ttl, 1, locks.HolderPod(ns, p.Name, string(p.UID)))
	if err != nil {
		return "", fmt.Errorf("acquiring %s/%s for pod %s: %w", ns, lock, pod, err)
	}
	if !a.Acquired {
		return "", fmt.Errorf("acquiring %s/%s for pod %s: %s", ns, lock, pod, a.Reason)
	}
	return p.UID, nil
}

// permitKey is the key deletes are recorded by: the permit of lock (slot 0).
func permitKey(ns, lock string) string { return ns + "/" + permit.Name(lock, 0) }

// deletes records when the watch saw the permits it is asked about go.
type deletes struct {
	mu   sync.Mutex
	want map[string]chan time.Time
	err  error // why the watch ended, when it did
	done chan struct{}
}

// expect registers a permit whose delete is to be timed, before the
// action that deletes it.
func (d *deletes) expect(key string) <-chan time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	ch := make(chan time.Time, 1)
	d.want[key] = ch
	return ch
}

// forget drops a registration that was not seen.
func (d *deletes) forget(key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.want, key)
}

func (d *deletes) seen(key string, at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ch, ok := d.want[key]; ok {
		ch <- at
		delete(d.want, key)
	}
}

// broken says why the watch ended, or nil while it runs.
func (d *deletes) broken() error {
	select {
	case <-d.done:
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.err
	default:
		return nil
	}
}

// watchFunc adapts a function to client-go's WatcherWithContext.
type watchFunc func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error)

func (f watchFunc) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return f(ctx, o)
}

// watchDeletes watches the metadata of every permit, from now until ctx
// ends, resuming after a broken watch from the last version seen, and
// stamps each delete with the moment the event arrived.
func watchDeletes(ctx context.Context, meta metadata.Interface) (*deletes, error) {
	res := meta.Resource(locksv1alpha1.GroupVersion.WithResource("queenlocks"))
	list, err := res.List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return nil, fmt.Errorf("listing permits to start the watch: %w", err)
	}
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, watchFunc(func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.AllowWatchBookmarks = true
		return res.Watch(ctx, o)
	}))
	if err != nil {
		return nil, err
	}
	d := &deletes{want: map[string]chan time.Time{}, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		defer rw.Stop()
		for {
			select {
			case <-ctx.Done():
				d.err = ctx.Err()
				return
			case ev, ok := <-rw.ResultChan():
				if !ok {
					d.mu.Lock()
					d.err = fmt.Errorf("the watch of permits ended")
					d.mu.Unlock()
					return
				}
				switch ev.Type {
				case watch.Deleted:
					if m, ok := ev.Object.(*metav1.PartialObjectMetadata); ok {
						d.seen(m.Namespace+"/"+m.Name, time.Now())
					}
				case watch.Error:
					d.mu.Lock()
					d.err = fmt.Errorf("the watch of permits failed: %w", apierrors.FromObject(ev.Object))
					d.mu.Unlock()
					return
				}
			}
		}
	}()
	return d, nil
}

// awaited is one timed delete: from when it was due to when it was seen.
type awaited struct {
	key  string
	due  time.Time
	seen <-chan time.Time
}

// collect waits until every awaited delete is seen or the deadline passes,
// and answers the lags of those seen and the keys of those missed.
func (d *deletes) collect(ctx context.Context, ws []awaited, deadline time.Time) (lags []time.Duration, missed []string, err error) {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for i, w := range ws {
		select {
		case at := <-w.seen:
			lags = append(lags, at.Sub(w.due))
		case <-timer.C:
			for _, w := range ws[i:] {
				select {
				case at := <-w.seen:
					lags = append(lags, at.Sub(w.due))
				default:
					d.forget(w.key)
					missed = append(missed, w.key)
				}
			}
			return lags, missed, nil
		case <-d.done:
			return nil, nil, d.broken()
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
	return lags, nil, nil
}
