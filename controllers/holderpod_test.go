package controllers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

func pod(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "job", Image: "job"}}}}
	if err := env.Client.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	return p
}

func holdAs(t *testing.T, ns, lock string, p *corev1.Pod) locks.Acquired {
	t.Helper()
	a, err := locks.New(env.Client, nil).Acquire(context.Background(), ns, lock, "owner-"+p.Name, 600, 1, locks.HolderPod(p.Namespace, p.Name, string(p.UID)))
	if err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	return a
}

func freedWithin(t *testing.T, ns, lock string, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	key := client.ObjectKey{Namespace: ns, Name: permit.Name(lock, 0)}
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, d, true, func(ctx context.Context) (bool, error) {
		return !exists(t, &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}), nil
	})
	if err != nil {
		t.Fatalf("lock %q was not freed within %v of its pod going", lock, d)
	}
	return time.Since(start)
}

func TestAPermitIsFreedWhenItsPodIsGone(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)

	deleted := pod(t, ns, "deleted")
	holdAs(t, ns, "on-delete", deleted)
	finished := pod(t, ns, "finished")
	holdAs(t, ns, "on-finish", finished)
	replaced := pod(t, ns, "replaced")
	holdAs(t, ns, "on-replace", replaced)
	alive := pod(t, ns, "alive")
	holdAs(t, ns, "kept", alive)
	plain, err := locks.New(env.Client, nil).Acquire(ctx, ns, "no-pod", "x", 600, 1)
	if err != nil || !plain.Acquired {
		t.Fatal(plain, err)
	}

	// Deleted (a pod not bound to a node goes at once).
	if err := env.Client.Delete(ctx, deleted); err != nil {
		t.Fatal(err)
	}
	t.Logf("freed %v after its pod was deleted", freedWithin(t, ns, "on-delete", 2*time.Second))

	// Finished.
	finished.Status.Phase = corev1.PodSucceeded
	if err := env.Client.Status().Update(ctx, finished); err != nil {
		t.Fatal(err)
	}
	t.Logf("freed %v after its pod finished", freedWithin(t, ns, "on-finish", 2*time.Second))

	// Replaced: another pod under the same name is another pod.
	if err := env.Client.Delete(ctx, replaced); err != nil {
		t.Fatal(err)
	}
	pod(t, ns, "replaced")
	freedWithin(t, ns, "on-replace", 2*time.Second)

	// A running pod's permit and a permit naming no pod are untouched.
	for _, lock := range []string{"kept", "no-pod"} {
		hs, err := locks.New(env.Client, nil).Get(ctx, ns, lock)
		if err != nil || len(hs) != 1 {
			t.Fatalf("lock %q: holders %v, %v", lock, hs, err)
		}
	}
}

// A takeover by another pod after expiry belongs to the new pod: the first
// pod's deletion does not free it.
func TestATakeoverIsNotFreedByThePreviousPod(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	first, second := pod(t, ns, "first"), pod(t, ns, "second")
	a, err := locks.New(env.Client, nil).Acquire(ctx, ns, "handover", "first", 1, 1, locks.HolderPod(first.Namespace, first.Name, string(first.UID)))
	if err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	var b locks.Acquired
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		b, err = locks.New(env.Client, nil, locks.WithGrace(env.Grace)).Acquire(ctx, ns, "handover", "second", 600, 1, locks.HolderPod(second.Namespace, second.Name, string(second.UID)))
		return b.Acquired, err
	})
	if err != nil {
		t.Fatalf("second pod never acquired: %+v %v", b, err)
	}
	if err := env.Client.Delete(ctx, first); err != nil {
		t.Fatal(err)
	}
	// Let the controller see the deletion: it follows the first pod no
	// longer, and it frees nothing. Prove it saw the deletion by deleting
	// the second pod afterwards and seeing that one free the lock.
	hs, err := locks.New(env.Client, nil).Get(ctx, ns, "handover")
	if err != nil || len(hs) != 1 || hs[0].Owner != "second" || hs[0].Token != b.Token {
		t.Fatalf("after the first pod's deletion: %v %v", hs, err)
	}
	if err := env.Client.Delete(ctx, second); err != nil {
		t.Fatal(err)
	}
	freedWithin(t, ns, "handover", 2*time.Second)
}

// A pod-bound credential may only name its own pod as the holder.
func TestAPodMayOnlyNameItself(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	me, other := pod(t, ns, "me"), pod(t, ns, "other")
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "worker"}}
	if err := env.Client.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "holder"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"locks.queen.dev"}, Resources: []string{"queenlocks"}, Verbs: []string{"*"}}}}
	bind := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "holder"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "holder"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "worker", Namespace: ns}}}
	for _, o := range []client.Object{role, bind} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// The API server reports the pod of a token bound to it; the pod must
	// run as the ServiceAccount for the binding to be accepted.
	bound := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bound"},
		Spec: corev1.PodSpec{ServiceAccountName: "worker", Containers: []corev1.Container{{Name: "job", Image: "job"}}}}
	if err := env.Client.Create(ctx, bound); err != nil {
		t.Fatal(err)
	}
	tr, err := env.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "worker", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: bound.Name, UID: bound.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = tr.Status.Token
	c, err := client.New(cfg, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	l := locks.New(c, nil)
	for _, p := range []*corev1.Pod{me, other} {
		if _, err := l.Acquire(ctx, ns, "claim-"+p.Name, "w", 600, 1, locks.HolderPod(p.Namespace, p.Name, string(p.UID))); err == nil || !containsAll(err.Error(), "holderPod", "may only name itself") {
			t.Fatalf("naming pod %s from pod %s: %v, want a refusal", p.Name, bound.Name, err)
		}
	}
	if a, err := l.Acquire(ctx, ns, "claim-self", "w", 600, 1, locks.HolderPod(bound.Namespace, bound.Name, string(bound.UID))); err != nil || !a.Acquired {
		t.Fatalf("naming its own pod: %+v %v", a, err)
	}
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
