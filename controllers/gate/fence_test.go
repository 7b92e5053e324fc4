package gate_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/permit"
)

// A gated pod is let in only once the fence of the objects bound to its
// slot has been raised to its token: a write of the pod before it, held
// up inside kube-apiserver, is refused after the next pod starts. The
// manager raises with its own ServiceAccount's rights, as installed.
func TestAGatedPodIsLetInAfterItsSlotsFenceIsRaised(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	gated(t, ns, "first", "nightly")
	gated(t, ns, "second", "nightly")
	first := admitted(t, ns, "first")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "report",
		Labels:      map[string]string{permit.GuardedLabel: "true"},
		Annotations: map[string]string{permit.GuardAnnotation: permit.Guard{Lock: "nightly", Token: token(t, first)}.String()}}}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	finish(t, first)
	second := admitted(t, ns, "second")
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "report"}, cm); err != nil {
		t.Fatal(err)
	}
	if got, want := cm.Annotations[permit.FenceAnnotation], (permit.Guard{Lock: "nightly", Token: token(t, second)}).String(); got != want {
		t.Fatalf("record %q when the second pod was let in, want %q", got, want)
	}
}
