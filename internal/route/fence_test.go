package route_test

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/permit"
)

// Every acquire through the route, on either replica, raises the fence of
// the slot's bound objects to the new holding's token before it answers,
// so the answer is never ahead of the fence; a repeat acquire (already)
// leaves it where it is. webhook/nowindow_test.go holds a replaced
// holder's write inside kube-apiserver across such an acquire.
func TestARouteAcquireRaisesTheFenceBeforeItAnswers(t *testing.T) {
	tp := env.Production(t, controlplane.TopologyOptions{})
	ctx := context.Background()
	acquire := func(replica int, owner string) uint64 {
		r := results(t, tp, tp.Replicas[replica], fmt.Sprintf(`{"op":"acquire","name":"report","owner":%q,"ttlSeconds":600}`, owner))[0]
		if r["acquired"] != true {
			t.Fatalf("acquire by %s: %v", owner, r)
		}
		return num(t, r["token"])
	}
	record := func() string {
		cm := &corev1.ConfigMap{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: tp.LockNS, Name: "out"}, cm); err != nil {
			t.Fatal(err)
		}
		return cm.Annotations[permit.FenceAnnotation]
	}
	a := acquire(0, "a")
	guardA := permit.Guard{Lock: "report", Token: a}.String()
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: tp.LockNS, Name: "out",
			Labels:      map[string]string{permit.GuardedLabel: "true"},
			Annotations: map[string]string{permit.GuardAnnotation: guardA}},
		Data: map[string]string{"report": "by A"},
	}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	if r := results(t, tp, tp.Replicas[1], releaseOp("report", "a", a))[0]; r["released"] != true {
		t.Fatalf("release: %v", r)
	}
	b := acquire(1, "b")
	want := permit.Guard{Lock: "report", Token: b}.String()
	if got := record(); got != want {
		t.Fatalf("record %q when replica 1 answered the acquire, want %q", got, want)
	}
	if again := acquire(0, "b"); again != b {
		t.Fatalf("repeat acquire answered token %d, want %d", again, b)
	}
	if got := record(); got != want {
		t.Fatalf("record %q after a repeat acquire, want %q", got, want)
	}
}
