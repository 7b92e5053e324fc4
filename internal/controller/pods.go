package controller

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch

// PodState is what the tracker knows of a holder's pod.
type PodState struct {
	// Known is false until the first list of the pod has answered.
	Known bool
	// Gone: no pod of that name, or a pod with another UID, or one that
	// has finished (Succeeded or Failed).
	Gone bool
	Why  string
}

// Pods follows the pods that hold permits, and only those: one watch of
// one pod's metadata (a field selector on its name) for each pod that some
// permit names, stopped when no permit names it any more. Nothing of the
// cluster's other pods reaches the manager, and nothing is cached but a
// few fields per followed pod. A change to a followed pod reads that pod
// once, for its phase, which metadata does not carry.
type Pods struct {
	Meta metadata.Interface
	Core kubernetes.Interface
	// Events receives the permits to reconcile when their pod changed.
	Events chan event.GenericEvent

	base   context.Context // ends when the tracker stops
	cancel context.CancelFunc
	mu     sync.Mutex
	pods   map[podKey]*followed
	of     map[types.NamespacedName]podKey // which pod each permit names
}

// podKey is one pod: a pod created again under the same name is another,
// followed on its own.
type podKey struct{ ns, name, uid string }

// podKeyOf is the pod a permit in namespace permitNS names. The pod lives
// in its own namespace, often not the permit's; a permit written before
// holderPod recorded the namespace names a pod of its own namespace.
func podKeyOf(permitNS string, hp *locksv1alpha1.PodRef) podKey {
	ns := hp.Namespace
	if ns == "" {
		ns = permitNS
	}
	return podKey{ns, hp.Name, hp.UID}
}

type followed struct {
	state   PodState
	permits map[types.NamespacedName]bool
	stop    context.CancelFunc
}

// NewPods makes a tracker. Add it to the manager: it follows pods while it
// runs, which is while this replica leads.
func NewPods(meta metadata.Interface, core kubernetes.Interface) *Pods {
	base, cancel := context.WithCancel(context.Background())
	t := &Pods{Meta: meta, Core: core, Events: make(chan event.GenericEvent, 1024), pods: map[podKey]*followed{}, of: map[types.NamespacedName]podKey{}, base: base, cancel: cancel}
	followedFrom.Store(t)
	return t
}

// Start runs until ctx ends, then stops following every pod.
func (t *Pods) Start(ctx context.Context) error {
	<-ctx.Done()
	t.cancel()
	t.mu.Lock()
	defer t.mu.Unlock()
	for pk, f := range t.pods {
		t.stopLocked(pk, f)
	}
	return nil
}

// NeedLeaderElection: only the leader frees permits, so only it follows pods.
func (t *Pods) NeedLeaderElection() bool { return true }

// Track makes sure the permit's holder pod is followed, and answers what
// is known of it. A permit whose holder pod changed (a takeover) moves to
// the new pod.
func (t *Pods) Track(ctx context.Context, p *locksv1alpha1.QueenLock) PodState {
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	hp := p.Spec.HolderPod
	t.mu.Lock()
	defer t.mu.Unlock()
	t.untrackLocked(key, hp)
	if hp == nil {
		return PodState{}
	}
	pk := podKeyOf(p.Namespace, hp)
	f := t.pods[pk]
	if f == nil {
		wctx, cancel := context.WithCancel(logf.IntoContext(t.base, logf.FromContext(ctx)))
		f = &followed{permits: map[types.NamespacedName]bool{}, stop: cancel}
		t.pods[pk] = f
		go t.follow(wctx, pk)
	}
	f.permits[key] = true
	t.of[key] = pk
	return f.state
}

// Untrack forgets a permit that is gone.
func (t *Pods) Untrack(key types.NamespacedName) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.untrackLocked(key, nil)
}

// untrackLocked stops following key's pod for key, unless it is keep.
func (t *Pods) untrackLocked(key types.NamespacedName, keep *locksv1alpha1.PodRef) {
	pk, ok := t.of[key]
	if !ok {
		return
	}
	if keep != nil && pk == podKeyOf(key.Namespace, keep) {
		return
	}
	f := t.pods[pk]
	delete(t.of, key)
	if f == nil {
		return
	}
	delete(f.permits, key)
	if len(f.permits) == 0 {
		t.stopLocked(pk, f)
	}
}

func (t *Pods) stopLocked(pk podKey, f *followed) {
	f.stop()
	delete(t.pods, pk)
	for k := range f.permits {
		delete(t.of, k)
	}
}

// Followed is how many pods are followed, for a metric and for tests.
func (t *Pods) Followed() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pods)
}

// follow lists and then watches one pod's metadata until ctx ends,
// starting over from a fresh list whenever the watch ends.
func (t *Pods) follow(ctx context.Context, pk podKey) {
	log := logf.FromContext(ctx).WithValues("pod", pk.ns+"/"+pk.name)
	pods := t.Meta.Resource(corev1.SchemeGroupVersion.WithResource("pods")).Namespace(pk.ns)
	sel := fields.OneTermEqualSelector("metadata.name", pk.name).String()
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			holderPodErrors.Inc()
			log.V(1).Info("listing a holder pod", "error", err.Error())
			if !sleep(ctx, backoff) {
				return
			}
			backoff = min(backoff*2, 10*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		if len(list.Items) == 0 {
			t.set(ctx, pk, PodState{Known: true, Gone: true, Why: "deleted"})
		} else {
			t.judge(ctx, pk, string(list.Items[0].UID))
		}
		w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion, AllowWatchBookmarks: true})
		if err != nil {
			holderPodErrors.Inc()
			continue
		}
		for ev := range w.ResultChan() {
			m, ok := ev.Object.(*metav1.PartialObjectMetadata)
			switch {
			case ev.Type == watch.Deleted:
				t.set(ctx, pk, PodState{Known: true, Gone: true, Why: "deleted"})
			case ok && (ev.Type == watch.Added || ev.Type == watch.Modified):
				t.judge(ctx, pk, string(m.UID))
			}
		}
		w.Stop()
	}
}

// judge decides on a pod that exists: another UID is another pod; the
// same one is gone once it has finished, which only its status tells.
func (t *Pods) judge(ctx context.Context, pk podKey, seen string) {
	if seen != pk.uid {
		t.set(ctx, pk, PodState{Known: true, Gone: true, Why: "replaced"})
		return
	}
	pod, err := t.Core.CoreV1().Pods(pk.ns).Get(ctx, pk.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		t.set(ctx, pk, PodState{Known: true, Gone: true, Why: "deleted"})
	case err != nil:
		return // the next event or list decides
	case string(pod.UID) != pk.uid:
		t.set(ctx, pk, PodState{Known: true, Gone: true, Why: "replaced"})
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		t.set(ctx, pk, PodState{Known: true, Gone: true, Why: "finished"})
	default:
		t.set(ctx, pk, PodState{Known: true})
	}
}

// set records a pod's state and, when it is gone, asks for its permits to
// be reconciled.
func (t *Pods) set(ctx context.Context, pk podKey, s PodState) {
	t.mu.Lock()
	f := t.pods[pk]
	if f == nil {
		t.mu.Unlock()
		return
	}
	f.state = s
	var keys []types.NamespacedName
	if s.Gone {
		for k := range f.permits {
			keys = append(keys, k)
		}
	}
	t.mu.Unlock()
	for _, k := range keys {
		select {
		case t.Events <- event.GenericEvent{Object: &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}}:
		case <-ctx.Done():
			return
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
