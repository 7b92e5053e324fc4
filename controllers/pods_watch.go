package controllers

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// spaceLocked is the watch of ns, started if there is none.
func (t *Pods) spaceLocked(ns string) *space {
	if sp := t.spaces[ns]; sp != nil {
		return sp
	}
	log := podsLog.WithValues("namespace", ns)
	sp := &space{uids: map[string]map[string]bool{}}
	failed := func(what string, err error) {
		holderPodErrors.Inc()
		log.V(1).Info(what+" holder pods", "error", err.Error())
	}
	pods := t.Meta.Resource(corev1.SchemeGroupVersion.WithResource("pods")).Namespace(ns)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = unfinished
			l, err := pods.List(ctx, o)
			if err != nil {
				failed("listing", err)
			}
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = unfinished
			w, err := pods.Watch(ctx, o)
			if err != nil {
				failed("watching", err)
			}
			return w, err
		},
	}
	// A plain informer, not a shared one: nothing else reads these pods,
	// and a shared informer's fan-out (its goroutines and its buffer of
	// 1,024 notifications) was most of what each namespace cost.
	store, inf := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &metav1.PartialObjectMetadata{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { t.seen(sp, o, false) },
			UpdateFunc: func(_, o any) { t.seen(sp, o, false) },
			DeleteFunc: func(o any) { t.seen(sp, o, true) },
		},
		// The name and UID are all that is judged: the rest (labels,
		// annotations, managedFields) is dropped before it is stored.
		Transform: func(o any) (any, error) {
			if m, ok := o.(*metav1.PartialObjectMetadata); ok {
				return &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
					Namespace: m.Namespace, Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion}}, nil
			}
			return o, nil
		},
	})
	sp.store = store
	sctx, stop := context.WithCancel(t.base)
	sp.stop = stop
	t.spaces[ns] = sp
	go func() {
		select {
		case t.lists <- struct{}{}:
		case <-sctx.Done():
			return
		}
		go inf.RunWithContext(sctx)
		synced := inf.HasSyncedChecker().Done()
		hold := time.NewTimer(t.hold)
		select {
		case <-synced:
		case <-hold.C:
		case <-sctx.Done():
		}
		hold.Stop()
		<-t.lists
		select {
		case <-synced:
			t.listed(ns, sp)
		case <-sctx.Done():
		}
	}()
	return sp
}

// listed judges the pods followed in ns once its first list is in.
func (t *Pods) listed(ns string, sp *space) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.spaces[ns] != sp {
		return // stopped meanwhile
	}
	sp.synced = true
	for name, uids := range sp.uids {
		for uid := range uids {
			pk := podKey{ns, name, uid}
			if f := t.pods[pk]; f != nil && !f.state.Known {
				t.lookLocked(sp, pk, f)
			}
		}
	}
}

// lookLocked judges a followed pod by the namespace's cache. One the cache
// lacks, or holds under another UID, is read on its own: it may be newer
// than the watch, and the pod of the cache the one it replaced.
func (t *Pods) lookLocked(sp *space, pk podKey, f *followed) {
	o, ok, _ := sp.store.GetByKey(pk.ns + "/" + pk.name)
	if m, _ := o.(*metav1.PartialObjectMetadata); ok && m != nil && string(m.UID) == pk.uid {
		t.setLocked(f, PodState{Known: true})
		return
	}
	t.checkLocked(pk, f)
}

// seen is a watch event of a pod of sp's namespace: present, or gone from
// the unfinished pods (deleted, or finished).
func (t *Pods) seen(sp *space, o any, gone bool) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o, gone = d.Obj, true
	}
	m, ok := o.(*metav1.PartialObjectMetadata)
	if !ok {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.spaces[m.Namespace] != sp {
		return
	}
	for uid := range sp.uids[m.Name] {
		pk := podKey{m.Namespace, m.Name, uid}
		f := t.pods[pk]
		switch {
		case f == nil:
		case uid != string(m.UID):
			// Another pod under the name. It may be the one that
			// replaced ours, or the one ours replaced, whose last events
			// the watch brings after a permit already names ours (the
			// permits' watch is another stream): which, a read tells.
			// Its delete says nothing of ours.
			if !gone {
				t.checkLocked(pk, f)
			}
		case gone:
			// Deleted or finished: a read of the pod tells which, for
			// the Event; the permit is freed either way.
			f.state = PodState{Known: true, Gone: true, Why: "deleted or finished"}
			t.checkLocked(pk, f)
		default:
			t.setLocked(f, PodState{Known: true})
		}
	}
}

// setLocked records a pod's state; a pod once gone stays gone.
