package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// recorder watches the permit and the ConfigMap and keeps every version.
// A broken watch (the API server or etcd was killed) is opened again from
// the last version it delivered; the harness runs kube-apiserver with its
// watch cache off and compaction off, so etcd can replay everything after
// any version and no event is skipped. If a watch is ever refused as too
// old, the history has a hole and the run fails.
type recorder struct {
	mu      sync.Mutex
	permits []Event
	sem     []Event // the semaphore's permits
	objects []Event
	// leaderPermits and leaderObjects are the fenced leaders' permit and
	// ConfigMap (leader.go).
	leaderPermits, leaderObjects []Event
	pods                         []PodGone // holder pods the nemesis deleted
	holds                        []Hold    // the gated pods' holds, as their clients wrote them
	waiters                      []WaiterEvent
	leases                       []LeaseEvent
	gatedPods                    map[string]*PodInfo // the gated pods, by UID
	podOrder                     []string
	outages                      [][2]int64
	err                          error
	owner                        string // the permit's current owner, "" when free
	expires                      int64  // and when its lease ends
}

func (r *recorder) run(ctx context.Context, c client.WithWatch, cs kubernetes.Interface, ns, permitName, object string, from uint64) {
	var wg sync.WaitGroup
	wg.Add(7)
	go func() {
		defer wg.Done()
		r.follow(ctx, from, func(ctx context.Context, rv string) (watch.Interface, error) {
			return c.Watch(ctx, &locksv1alpha1.QueenLockWaiterList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		}, func(t watch.EventType, o runtime.Object, v uint64, seen int64) {
			w := o.(*locksv1alpha1.QueenLockWaiter)
			e := WaiterEvent{Type: string(t), Version: v, Seen: seen, UID: string(w.UID), Lock: w.Spec.Lock, Owner: w.Spec.Owner,
				Limit: int(w.Spec.Limit), Position: uint64(w.Spec.Position)}
			if w.Spec.Pod != nil {
				e.Pod = w.Spec.Pod.UID
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			r.waiters = append(r.waiters, e)
		})
	}()
	go func() {
		defer wg.Done()
		r.follow(ctx, from, func(ctx context.Context, rv string) (watch.Interface, error) {
			return cs.CoordinationV1().Leases(ns).Watch(ctx, metav1.ListOptions{
				FieldSelector: fields.OneTermEqualSelector("metadata.name", ManagerLease).String(), ResourceVersion: rv})
		}, func(t watch.EventType, o runtime.Object, v uint64, seen int64) {
			l := o.(*coordinationv1.Lease)
			e := LeaseEvent{Version: v, Seen: seen}
			if t != watch.Deleted && l.Spec.HolderIdentity != nil {
				e.Holder = *l.Spec.HolderIdentity
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			r.leases = append(r.leases, e)
		})
	}()
	go func() {
		defer wg.Done()
		r.follow(ctx, from, func(ctx context.Context, rv string) (watch.Interface, error) {
			return c.Watch(ctx, &locksv1alpha1.QueenLockList{}, client.InNamespace(ns),
				client.MatchingFields{"metadata.name": permit.Name(LeaderLock, 0)}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		}, func(t watch.EventType, o runtime.Object, v uint64, seen int64) {
			e := permitEventOf(t, o.(*locksv1alpha1.QueenLock), v, seen)
			r.mu.Lock()
			defer r.mu.Unlock()
			r.leaderPermits = append(r.leaderPermits, e)
		})
	}()
	go func() {
		defer wg.Done()
		r.follow(ctx, from, func(ctx context.Context, rv string) (watch.Interface, error) {
			return cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{
				FieldSelector: fields.OneTermEqualSelector("metadata.name", LeaderObject).String(), ResourceVersion: rv})
		}, func(t watch.EventType, o runtime.Object, v uint64, seen int64) {
			e := objectEventOf(t, o.(*corev1.ConfigMap), v, seen)
			r.mu.Lock()
			defer r.mu.Unlock()
			r.leaderObjects = append(r.leaderObjects, e)
		})
	}()
	go func() {
		defer wg.Done()
		r.follow(ctx, from, func(ctx context.Context, rv string) (watch.Interface, error) {
			return c.Watch(ctx, &locksv1alpha1.QueenLockList{}, client.InNamespace(ns),
				client.MatchingLabels{permit.LockLabel: permit.LabelValue(Semaphore)}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		}, r.semEvent)
	}()
	go func() {
		defer wg.Done()
		r.follow(ctx, from, func(ctx context.Context, rv string) (watch.Interface, error) {
			return c.Watch(ctx, &locksv1alpha1.QueenLockList{}, client.InNamespace(ns),
				client.MatchingFields{"metadata.name": permitName}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		}, r.permitEvent)
	}()
	go func() {
		defer wg.Done()
		r.follow(ctx, from, func(ctx context.Context, rv string) (watch.Interface, error) {
			return cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{
				FieldSelector: fields.OneTermEqualSelector("metadata.name", object).String(), ResourceVersion: rv})
		}, r.objectEvent)
	}()
	wg.Wait()
}

func (r *recorder) follow(ctx context.Context, last uint64, open func(context.Context, string) (watch.Interface, error), add func(watch.EventType, runtime.Object, uint64, int64)) {
	for ctx.Err() == nil {
		w, err := open(ctx, strconv.FormatUint(last, 10))
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				if st := apierrors.FromObject(ev.Object); apierrors.IsResourceExpired(st) || apierrors.IsGone(st) {
					r.fail(fmt.Errorf("a watch was refused from version %d (%w): the history has a hole", last, st))
					w.Stop()
					return
				}
				break
			}
			if ev.Type != watch.Added && ev.Type != watch.Modified && ev.Type != watch.Deleted {
				continue
			}
			m, err := metaOf(ev.Object)
			if err != nil {
				r.fail(err)
				continue
			}
			v, err := permit.Token(m.GetResourceVersion())
			if err != nil {
				r.fail(err)
				continue
			}
			add(ev.Type, ev.Object, v, time.Now().UnixNano())
			last = v
		}
		w.Stop()
	}
}

func metaOf(o runtime.Object) (metav1.Object, error) {
	m, ok := o.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("a watch delivered %T", o)
	}
	return m, nil
}

func (r *recorder) semEvent(t watch.EventType, o runtime.Object, v uint64, seen int64) {
	e := permitEventOf(t, o.(*locksv1alpha1.QueenLock), v, seen)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sem = append(r.sem, e)
}

func permitEventOf(t watch.EventType, p *locksv1alpha1.QueenLock, v uint64, seen int64) Event {
	e := Event{Type: string(t), Version: v, Seen: seen, UID: string(p.UID), Owner: p.Spec.Owner, Slot: int(p.Spec.Slot),
		Deleting: t != watch.Deleted && p.DeletionTimestamp != nil}
	if p.Spec.AcquireTime != nil {
		e.AcquireTime = p.Spec.AcquireTime.UnixNano()
	}
	if p.Spec.RenewTime != nil {
		e.RenewTime = p.Spec.RenewTime.UnixNano()
	}
	if p.Spec.ExpireTime != nil {
		e.ExpireTime = p.Spec.ExpireTime.UnixNano()
	}
	if p.Spec.HolderPod != nil {
		e.HolderPod = p.Spec.HolderPod.UID
	}
	return e
}

func (r *recorder) permitEvent(t watch.EventType, o runtime.Object, v uint64, seen int64) {
	p := o.(*locksv1alpha1.QueenLock)
	e := permitEventOf(t, p, v, seen)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.permits = append(r.permits, e)
	r.owner, r.expires = p.Spec.Owner, e.ExpireTime
	if t == watch.Deleted || e.Deleting {
		r.owner = ""
	}
}

func (r *recorder) objectEvent(t watch.EventType, o runtime.Object, v uint64, seen int64) {
	e := objectEventOf(t, o.(*corev1.ConfigMap), v, seen)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.objects = append(r.objects, e)
}

func objectEventOf(t watch.EventType, cm *corev1.ConfigMap, v uint64, seen int64) Event {
	e := Event{Type: string(t), Version: v, Seen: seen, Writer: cm.Data["writer"]}
	e.Counter, _ = strconv.ParseInt(cm.Data["counter"], 10, 64)
	e.Token, _ = strconv.ParseUint(cm.Data["token"], 10, 64)
	if g, bound, err := permit.ParseFence(cm.Annotations[permit.FenceAnnotation]); err == nil {
		e.Fence = g.Token
		if bound {
			e.FenceLock = fmt.Sprintf("%s#%d", g.Lock, g.Slot)
		}
	}
	e.Deletable = cm.Annotations[permit.DeletableAnnotation]
	e.Guarded = cm.Labels[permit.GuardedLabel] == "true"
	return e
}

// seenLeaders tells whether the leaders' watches have delivered at least
// these versions (0: nothing to wait for).
func (r *recorder) seenLeaders(permitVersion, objectVersion uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	reached := func(evs []Event, v uint64) bool { return v == 0 || len(evs) > 0 && evs[len(evs)-1].Version >= v }
	return reached(r.leaderPermits, permitVersion) && reached(r.leaderObjects, objectVersion)
}

// pod merges what a gated client saw of one of its pods.
func (r *recorder) pod(p PodInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gatedPods == nil {
		r.gatedPods = map[string]*PodInfo{}
	}
	q := r.gatedPods[p.UID]
	if q == nil {
		q = &PodInfo{UID: p.UID}
		r.gatedPods[p.UID] = q
		r.podOrder = append(r.podOrder, p.UID)
	}
	if p.Name != "" {
		q.Name, q.Lock, q.Limit, q.Shape, q.QueuedAt = p.Name, p.Lock, p.Limit, p.Shape, p.QueuedAt
	}
	if p.NotAdmitted != 0 && q.NotAdmitted == 0 {
		q.NotAdmitted, q.Reason = p.NotAdmitted, p.Reason
	}
	if p.Gone != 0 && q.Gone == 0 {
		q.Gone = p.Gone
	}
}

// podInfos are the gated pods recorded, in the order first seen.
func (r *recorder) podInfos() []PodInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]PodInfo, 0, len(r.podOrder))
	for _, uid := range r.podOrder {
		out = append(out, *r.gatedPods[uid])
	}
	return out
}

func (r *recorder) outage(from, to int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outages = append(r.outages, [2]int64{from, to})
}

func (r *recorder) podGone(p PodGone) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pods = append(r.pods, p)
}

func (r *recorder) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
	}
}

// holder answers the permit's owner and the end of its lease, as last
// recorded; "" when the permit does not exist.
func (r *recorder) holder() (string, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.owner, r.expires
}

// seen tells whether both watches have delivered at least these versions.
func (r *recorder) seen(permitVersion, objectVersion uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	last := func(evs []Event) uint64 {
		if len(evs) == 0 {
			return 0
		}
		return evs[len(evs)-1].Version
	}
	return last(r.permits) >= permitVersion && last(r.objects) >= objectVersion
}
