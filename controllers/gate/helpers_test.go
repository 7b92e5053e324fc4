package gate_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/permit/gatedpod"
)

// entitledNamespace is a new namespace whose ServiceAccount "job" may hold
// locks there, as a RoleBinding to the holder role grants.
func entitledNamespace(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	ns := env.Namespace(t, "gate")
	objs := []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "job"}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "holder"}, Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{locksv1alpha1.GroupVersion.Group}, Resources: []string{"queenlocks"},
			Verbs: []string{"create", "update", "patch", "delete", "get", "list", "watch"},
		}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "holder"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "holder"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "job"}}},
	}
	for _, o := range objs {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	return ns
}

// newGated builds a gated pod of ServiceAccount "job" waiting for lock.
func newGated(ns, name, lock string, annotations ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels:      map[string]string{gatedpod.Label: gatedpod.LabelValue},
			Annotations: map[string]string{gatedpod.LockAnnotation: lock}},
		Spec: corev1.PodSpec{ServiceAccountName: "job", Containers: []corev1.Container{{Name: "job", Image: "job"}}},
	}
	for i := 0; i+1 < len(annotations); i += 2 {
		p.Annotations[annotations[i]] = annotations[i+1]
	}
	return p
}

// gated creates a gated pod and answers it as stored.
func gated(t *testing.T, ns, name, lock string, annotations ...string) *corev1.Pod {
	t.Helper()
	p := newGated(ns, name, lock, annotations...)
	if err := env.Client.Create(context.Background(), p); err != nil {
		t.Fatalf("creating gated pod %s: %v", name, err)
	}
	return p
}

func get(t *testing.T, ns, name string) (*corev1.Pod, bool) {
	t.Helper()
	var p corev1.Pod
	err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &p)
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return &p, true
}

// admitted waits until the manager let the pod in and answers it.
func admitted(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	var got *corev1.Pod
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		p, ok := get(t, ns, name)
		if ok && !gatedpod.Gated(p) {
			got = p
		}
		return got != nil, nil
	})
	if err != nil {
		t.Fatalf("pod %s was not let in within 30s", name)
	}
	if got.Annotations[gatedpod.TokenAnnotation] == "" || got.Annotations[gatedpod.SlotAnnotation] == "" {
		t.Fatalf("pod %s was let in without its token and slot: %v", name, got.Annotations)
	}
	return got
}

// told waits for an event on the pod with reason whose note contains text.
func told(t *testing.T, p *corev1.Pod, reason, text string) {
	t.Helper()
	var seen []string
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var list eventsv1.EventList
		if err := env.Client.List(ctx, &list, client.InNamespace(p.Namespace)); err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, e := range list.Items {
			if e.Regarding.UID != p.UID {
				continue
			}
			seen = append(seen, e.Reason+": "+e.Note)
			if e.Reason == reason && strings.Contains(e.Note, text) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s was not told %s %q; its events: %q", p.Name, reason, text, seen)
	}
}

// finish marks the pod Succeeded, as the kubelet would.
func finish(t *testing.T, p *corev1.Pod) time.Time {
	t.Helper()
	cur, ok := get(t, p.Namespace, p.Name)
	if !ok {
		t.Fatalf("pod %s is gone", p.Name)
	}
	cur.Status.Phase = corev1.PodSucceeded
	if err := env.Client.Status().Update(context.Background(), cur); err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

func remove(t *testing.T, p *corev1.Pod) time.Time {
	t.Helper()
	if err := env.Client.Delete(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

// permitOf is the permit held for the admitted pod, which must name it.
func permitOf(t *testing.T, p *corev1.Pod) *locksv1alpha1.QueenLock {
	t.Helper()
	slot, err := strconv.Atoi(p.Annotations[gatedpod.SlotAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	var q locksv1alpha1.QueenLock
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: p.Namespace, Name: permit.Name(p.Annotations[gatedpod.LockAnnotation], slot)}, &q); err != nil {
		t.Fatalf("the permit of pod %s: %v", p.Name, err)
	}
	if q.ResourceVersion != p.Annotations[gatedpod.TokenAnnotation] {
		t.Fatalf("pod %s carries token %s, its permit is at %s", p.Name, p.Annotations[gatedpod.TokenAnnotation], q.ResourceVersion)
	}
	if q.Spec.Owner != "pod:"+string(p.UID) || q.Spec.HolderPod == nil || q.Spec.HolderPod.UID != string(p.UID) ||
		q.Spec.HolderPod.Name != p.Name || q.Spec.HolderPod.Namespace != p.Namespace {
		t.Fatalf("the permit of pod %s names owner %q and pod %+v", p.Name, q.Spec.Owner, q.Spec.HolderPod)
	}
	return &q
}

// freedWithin waits until no permit of lock is held by the pod.
func freedWithin(t *testing.T, p *corev1.Pod, since time.Time, d time.Duration) time.Duration {
	t.Helper()
	owner := "pod:" + string(p.UID)
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, d, true, func(ctx context.Context) (bool, error) {
		return len(heldBy(t, p.Namespace, p.Annotations[gatedpod.LockAnnotation], owner)) == 0, nil
	})
	if err != nil {
		t.Fatalf("the permit of pod %s was not freed within %s of its end", p.Name, d)
	}
	return time.Since(since)
}

func heldBy(t *testing.T, ns, lock, owner string) []locksv1alpha1.QueenLock {
	t.Helper()
	var list locksv1alpha1.QueenLockList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []locksv1alpha1.QueenLock
	for _, q := range list.Items {
		if q.Spec.Lock == lock && (owner == "" || q.Spec.Owner == owner) {
			out = append(out, q)
		}
	}
	return out
}

// running counts the pods of ns let in and not yet finished.
func running(t *testing.T, ns string) []string {
	t.Helper()
	var list corev1.PodList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range list.Items {
		if gatedpod.Labelled(&p) && !gatedpod.Gated(&p) && !gatedpod.Finished(&p) {
			out = append(out, p.Name)
		}
	}
	return out
}

func token(t *testing.T, p *corev1.Pod) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(p.Annotations[gatedpod.TokenAnnotation], 10, 64)
	if err != nil {
		t.Fatal(fmt.Errorf("pod %s token: %w", p.Name, err))
	}
	return n
}
