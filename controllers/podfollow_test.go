package controllers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/controllers"
	"github.com/queen-locks/queen-locks/permit"
)

// tracker starts a holder-pod tracker of its own, as the admin.
func tracker(t *testing.T) *controllers.Pods {
	t.Helper()
	return trackerAs(t, env.Config)
}

// trackerAs starts a holder-pod tracker of its own, as cfg's user.
func trackerAs(t *testing.T, cfg *rest.Config) *controllers.Pods {
	t.Helper()
	restore := controllers.KeepFollowed()
	mc := rest.CopyConfig(cfg)
	mc.DisableCompression = true
	meta, err := metadata.NewForConfig(mc)
	if err != nil {
		t.Fatal(err)
	}
	core, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr := controllers.NewPods(meta, core)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		restore()
	})
	return tr
}

// naming is a permit (never written) of lock in ns whose holder is p.
func naming(ns, lock string, p *corev1.Pod) *locksv1alpha1.QueenLock {
	return &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: permit.Name(lock, 0)},
		Spec: locksv1alpha1.QueenLockSpec{Lock: lock, HolderPod: &locksv1alpha1.PodRef{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID)}}}
}

// One watch per namespace, however many pods and permits: permits in one
// namespace name pods of three others, two permits per pod.
func TestHolderPodsAreWatchedByNamespace(t *testing.T) {
	ctx := context.Background()
	tr := tracker(t)
	home := namespace(t)
	var pods []*corev1.Pod
	var permits []*locksv1alpha1.QueenLock
	for i := range 3 {
		ns := namespace(t)
		for j := range 4 {
			p := pod(t, ns, fmt.Sprintf("p%d", j))
			pods = append(pods, p)
			for k := range 2 {
				permits = append(permits, naming(home, fmt.Sprintf("l%d-%d-%d", i, j, k), p))
			}
		}
	}
	for _, q := range permits {
		if st := tr.Track(ctx, q); st.Gone {
			t.Fatalf("%s: a running pod is gone: %+v", q.Name, st)
		}
	}
	await(t, "every pod to be known", func() bool {
		for _, q := range permits {
			if st := tr.Track(ctx, q); !st.Known || st.Gone {
				return false
			}
		}
		return true
	})
	if f, w := tr.Followed(), tr.Watched(); f != 12 || w != 3 {
		t.Fatalf("%d pods followed over %d watches, want 12 over 3", f, w)
	}

	// Each way of going is told, for both permits of the pod.
	deleted, finished, replaced := pods[0], pods[5], pods[10]
	if err := env.Client.Delete(ctx, deleted); err != nil {
		t.Fatal(err)
	}
	finished.Status.Phase = corev1.PodFailed
	if err := env.Client.Status().Update(ctx, finished); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, replaced); err != nil {
		t.Fatal(err)
	}
	pod(t, replaced.Namespace, replaced.Name)
	want := map[types.NamespacedName]bool{}
	for _, q := range permits {
		if hp := q.Spec.HolderPod; hp.UID == string(deleted.UID) || hp.UID == string(finished.UID) || hp.UID == string(replaced.UID) {
			want[types.NamespacedName{Namespace: q.Namespace, Name: q.Name}] = true
		}
	}
	for len(want) > 0 {
		ev := <-tr.Events
		key := types.NamespacedName{Namespace: ev.Object.GetNamespace(), Name: ev.Object.GetName()}
		if !want[key] {
			t.Fatalf("permit %s reconciled, its pod is not gone", key)
		}
		delete(want, key)
	}
	whys := map[types.UID]string{deleted.UID: "deleted", finished.UID: "finished", replaced.UID: "replaced"}
	for _, q := range permits {
		st := tr.Track(ctx, q)
		if why, ok := whys[types.UID(q.Spec.HolderPod.UID)]; ok != st.Gone || (ok && st.Why != why && !(why == "replaced" && st.Why == "deleted")) {
			t.Errorf("%s: %+v, want gone %v (%s)", q.Name, st, ok, why)
		}
	}

	for _, q := range permits {
		tr.Untrack(types.NamespacedName{Namespace: q.Namespace, Name: q.Name})
	}
	if f, w := tr.Followed(), tr.Watched(); f != 0 || w != 0 {
		t.Fatalf("%d pods followed over %d watches after every permit went, want none", f, w)
	}
}

// A pod created just before a permit names it may not have reached the
// namespace's watch yet: it is read on its own, never taken for gone. A
// pod that was never there is.
func TestAPodNewerThanTheWatchIsNotGone(t *testing.T) {
	ctx := context.Background()
	tr := tracker(t)
	ns := namespace(t)
	first := naming(ns, "first", pod(t, ns, "first"))
	await(t, "the namespace's watch to have listed", func() bool { return tr.Track(ctx, first).Known })
	for i := range 20 {
		q := naming(ns, fmt.Sprintf("new-%d", i), pod(t, ns, fmt.Sprintf("new-%d", i)))
		if st := tr.Track(ctx, q); st.Gone {
			t.Fatalf("pod %d, just created: %+v", i, st)
		}
		await(t, "the new pod to be known", func() bool { st := tr.Track(ctx, q); return st.Known && !st.Gone })
	}
	ghost := naming(ns, "ghost", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ghost", UID: "no-such-uid"}})
	await(t, "a pod that never was to be gone", func() bool { st := tr.Track(ctx, ghost); return st.Gone && st.Why == "deleted" })
	if w := tr.Watched(); w != 1 {
		t.Errorf("%d watches, want 1", w)
	}
}

// A new leader follows many namespaces at once, and lists them a few at a
// time: more namespaces than list slots are all listed in the end.
func TestManyNamespacesAreAllListed(t *testing.T) {
	ctx := context.Background()
	tr := tracker(t)
	var permits []*locksv1alpha1.QueenLock
	for i := range 2*controllers.ListsAtOnce + 3 {
		ns := namespace(t)
		permits = append(permits, naming(ns, fmt.Sprintf("l%d", i), pod(t, ns, "p")))
	}
	for _, q := range permits {
		tr.Track(ctx, q)
	}
	await(t, "every pod of every namespace to be known", func() bool {
		for _, q := range permits {
			if st := tr.Track(ctx, q); !st.Known || st.Gone {
				return false
			}
		}
		return true
	})
	if w := tr.Watched(); w != len(permits) {
		t.Errorf("%d namespaces watched, want %d", w, len(permits))
	}
}

// Namespaces whose pods cannot be listed, more of them than list slots,
// give their slots up after a while: a namespace that can be listed is
// not kept waiting behind them for good.
func TestUnlistableNamespacesDoNotHoldTheLine(t *testing.T) {
	defer controllers.ListSlotHold(200 * time.Millisecond)()
	ctx := context.Background()
	open := namespace(t)
	// An identity that may read pods in open alone.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: open, Name: "partial"}}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: open, Name: "pods"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: open, Name: "pods"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: open, Name: sa.Name}}}
	for _, o := range []client.Object{sa, role, binding} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: fmt.Sprintf("system:serviceaccount:%s:%s", open, sa.Name)}
	tr := trackerAs(t, cfg)
	for i := range controllers.ListsAtOnce + 4 {
		ns := namespace(t)
		tr.Track(ctx, naming(ns, fmt.Sprintf("closed-%d", i), pod(t, ns, "p")))
	}
	q := naming(open, "open", pod(t, open, "p"))
	tr.Track(ctx, q)
	await(t, "the pod of the namespace that can be listed to be known", func() bool {
		st := tr.Track(ctx, q)
		return st.Known && !st.Gone
	})
}

// The last events of the pod a newer one of the same name replaced can
// reach the leader after a permit names the newer one (the permits' watch
// is another stream than the pods'): they set off a read, and do not free
// the newer pod's permit. A pod that is really gone still frees it.
func TestAnOlderPodOfTheNameDoesNotFreeTheNewer(t *testing.T) {
	ctx := context.Background()
	tr := tracker(t)
	ns := namespace(t)
	p := pod(t, ns, "web-0")
	q := naming(ns, "web", p)
	await(t, "the pod to be known", func() bool { st := tr.Track(ctx, q); return st.Known && !st.Gone })
	older := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p.Name, UID: "the-pod-it-replaced"}}
	for _, gone := range []bool{false, true} {
		tr.Seen(ns, older, gone)
		await(t, "the read the event set off to end", func() bool { return !tr.Reading(ns, p.Name, string(p.UID)) })
		if st := tr.Track(ctx, q); !st.Known || st.Gone {
			t.Fatalf("after an event of the older pod (gone %v), the running pod is %+v", gone, st)
		}
	}
	if err := env.Client.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	pod(t, ns, p.Name) // its successor, another UID
	await(t, "the replaced pod's permit to be freed", func() bool { return tr.Track(ctx, q).Gone })
}
