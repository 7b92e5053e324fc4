package controlplane_test

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/locks"
)

// make dev's manager runs as its own ServiceAccount with the generated
// RBAC: the route's writes and the webhook work under it, and the
// administrator is not taken for the manager (it may not name a holder
// pod, which only the manager does for callers it verified).
func TestTheDevManagerRunsAsItsOwnServiceAccount(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	e, err := controlplane.Start(controlplane.Options{ManagerConfig: controlplane.AsManagerServiceAccount})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Stop() }()
	ctx := context.Background()
	ns := e.Namespace(t, "dev")
	url, _ := e.ServeRoute(t, route.AuthNone, ns)
	_ = url
	l := locks.New(e.Client, nil)
	if a, err := l.Acquire(ctx, ns, "plain", "admin", 30, 1); err != nil || !a.Acquired {
		t.Fatalf("an administrator's acquire: %+v %v", a, err)
	}
	p := &locksv1alpha1.QueenLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "named.0"},
		Spec: locksv1alpha1.QueenLockSpec{Lock: "named", Limit: 1, Owner: "admin", TTLSeconds: 30,
			HolderPod: &locksv1alpha1.PodRef{Namespace: ns, Name: "someone", UID: "u"}},
	}
	if err := e.Client.Create(ctx, p); err == nil || !strings.Contains(err.Error(), "holderPod") {
		t.Fatalf("the administrator named a holder pod: %v, want a refusal (it is not the manager)", err)
	}
}
