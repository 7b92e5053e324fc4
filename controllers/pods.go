package controllers

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch

// PodState is what the tracker knows of a holder's pod.
type PodState struct {
	// Known is false until the pod's namespace has been listed and the pod
	// seen there, or read on its own.
	Known bool
	// Gone: no pod of that name, or a pod with another UID, or one that
	// has finished (Succeeded or Failed). A pod once gone stays gone: a
	// UID is never used again, and no pod comes back from a finished phase.
	Gone bool
	Why  string
}

var podsLog = logf.Log.WithName("holder-pods")

// unfinished selects the pods that may still run. A pod that finishes
// leaves the selection, and a watch tells that as a delete.
const unfinished = "status.phase!=Succeeded,status.phase!=Failed"

// Pods follows the pods that hold permits. It watches the metadata of the
// unfinished pods of each namespace where some permit's holder pod lives,
// one watch per such namespace, only while a permit names a pod there.
// So the watches kube-apiserver serves the leader grow with the namespaces
// that use pod-held locks, not with the permits (a watch per pod, the
// first design, cost the API server and this process about 40 KiB each;
// docs/development/benchmarks-scale.md). The cache keeps a pod's name and
// UID only: namespaces without pod-held locks never reach this process.
//
// A pod missing from a namespace's cache (created after the list, and not
// yet seen by the watch, or already gone) is read once on its own before
// its permits are judged: a lock is never freed because a watch lags.
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
	spaces map[string]*space               // the watch of each namespace with followed pods
	lists  chan struct{}                   // a slot per first list under way (listsAtOnce)
	hold   time.Duration                   // listSlotHold when the tracker was made
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
	state    PodState
	permits  map[types.NamespacedName]bool
	checking bool // a read of this pod on its own is under way
}

// space is the watch of one namespace's unfinished pods.
type space struct {
	store  cache.Store
	stop   context.CancelFunc
	synced bool
	// uids are the followed pods by name: two pods of one name (one
	// replacing the other) can both be named by permits for a while.
	uids map[string]map[string]bool
}

// listsAtOnce bounds the namespaces whose first list is under way at once.
// A new leader follows every namespace with holder pods together: at 1,000
// such namespaces, lists sent all at once queued in kube-apiserver ahead
// of the leader's own Lease renewal, long enough to lose the lease
// (docs/development/benchmarks-scale.md).
const listsAtOnce = 16

// listSlotHold is the longest a namespace keeps its slot before its first
// list is in, so that namespaces that cannot be listed (the API server
// refuses, or times out) do not keep the others waiting for good. Under a
// load that keeps lists longer than that, the bound is 16 new lists every
// listSlotHold rather than 16 at once.
var listSlotHold = 10 * time.Second

// NewPods makes a tracker. Add it to the manager: it follows pods while it
// runs, which is while this replica leads.
func NewPods(meta metadata.Interface, core kubernetes.Interface) *Pods {
	base, cancel := context.WithCancel(context.Background())
	t := &Pods{Meta: meta, Core: core, Events: make(chan event.GenericEvent, 1024),
		pods: map[podKey]*followed{}, of: map[types.NamespacedName]podKey{}, spaces: map[string]*space{},
		lists: make(chan struct{}, listsAtOnce), hold: listSlotHold, base: base, cancel: cancel}
	followedFrom.Store(t)
	return t
}

// Start runs until ctx ends, then stops every watch.
func (t *Pods) Start(ctx context.Context) error {
	<-ctx.Done()
	t.cancel()
	t.mu.Lock()
	defer t.mu.Unlock()
	for ns, sp := range t.spaces {
		sp.stop()
		delete(t.spaces, ns)
	}
	clear(t.pods)
	clear(t.of)
	return nil
}

// NeedLeaderElection: only the leader frees permits, so only it follows pods.
func (t *Pods) NeedLeaderElection() bool { return true }

// Track makes sure the permit's holder pod is followed, and answers what
// is known of it. A permit whose holder pod changed (a takeover) moves to
// the new pod.
func (t *Pods) Track(_ context.Context, p *locksv1alpha1.QueenLock) PodState {
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	hp := p.Spec.HolderPod
	t.mu.Lock()
	defer t.mu.Unlock()
	t.untrackLocked(key, hp)
	if hp == nil || t.base.Err() != nil {
		return PodState{}
	}
	pk := podKeyOf(p.Namespace, hp)
	f := t.pods[pk]
	if f == nil {
		f = &followed{permits: map[types.NamespacedName]bool{}}
		t.pods[pk] = f
		sp := t.spaceLocked(pk.ns)
		if sp.uids[pk.name] == nil {
			sp.uids[pk.name] = map[string]bool{}
		}
		sp.uids[pk.name][pk.uid] = true
		if sp.synced {
			t.lookLocked(sp, pk, f)
		}
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
	delete(t.of, key)
	f := t.pods[pk]
	if f == nil {
		return
	}
	delete(f.permits, key)
	if len(f.permits) > 0 {
		return
	}
	delete(t.pods, pk)
	sp := t.spaces[pk.ns]
	if sp == nil {
		return
	}
	delete(sp.uids[pk.name], pk.uid)
	if len(sp.uids[pk.name]) == 0 {
		delete(sp.uids, pk.name)
	}
	if len(sp.uids) == 0 {
		sp.stop()
		delete(t.spaces, pk.ns)
	}
}

// Followed is how many pods are followed, for a metric and for tests.
func (t *Pods) Followed() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pods)
}

// Watched is how many namespaces' pods are watched, for a metric and for
// tests.
func (t *Pods) Watched() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.spaces)
}

func (t *Pods) setLocked(f *followed, s PodState) {
	if f.state.Gone && !s.Gone {
		return
	}
	f.state = s
}

// notifyLocked records a state and, when the pod is gone, asks for its
// permits to be reconciled, off the lock.
func (t *Pods) notifyLocked(f *followed, s PodState) {
	t.setLocked(f, s)
	if !f.state.Gone {
		return
	}
	keys := make([]types.NamespacedName, 0, len(f.permits))
	for k := range f.permits {
		keys = append(keys, k)
	}
	go func() {
		for _, k := range keys {
			select {
			case t.Events <- event.GenericEvent{Object: &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}}:
			case <-t.base.Done():
				return
			}
		}
	}()
}

// checkLocked reads the pod on its own, once at a time, trying again with
// a backoff while the read fails and the pod is followed. A pod the watch
// already said is gone is reported gone even if it cannot be read.
func (t *Pods) checkLocked(pk podKey, f *followed) {
	if f.checking {
		return
	}
	f.checking = true
	ctx := t.base
	go func() {
		backoff := 100 * time.Millisecond
		for {
			s, err := t.read(ctx, pk)
			t.mu.Lock()
			cur := t.pods[pk]
			if cur != f { // no longer followed
				t.mu.Unlock()
				return
			}
			if err == nil || f.state.Gone || ctx.Err() != nil {
				f.checking = false
				if err != nil {
					s = f.state
				}
				t.notifyLocked(f, s)
				t.mu.Unlock()
				return
			}
			t.mu.Unlock()
			holderPodErrors.Inc()
			podsLog.V(1).Info("reading a holder pod", "pod", pk.ns+"/"+pk.name, "error", err.Error())
			if !sleep(ctx, backoff) {
				return
			}
			backoff = min(backoff*2, 10*time.Second)
		}
	}()
}

// read answers what the API server says of one pod now.
func (t *Pods) read(ctx context.Context, pk podKey) (PodState, error) {
	pod, err := t.Core.CoreV1().Pods(pk.ns).Get(ctx, pk.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return PodState{Known: true, Gone: true, Why: "deleted"}, nil
	case err != nil:
		return PodState{}, err
	case string(pod.UID) != pk.uid:
		return PodState{Known: true, Gone: true, Why: "replaced"}, nil
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return PodState{Known: true, Gone: true, Why: "finished"}, nil
	}
	return PodState{Known: true}, nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
