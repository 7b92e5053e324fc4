package locks_test

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// apiRequests reads kube-apiserver's count of the requests it served, by "VERB resource".
func apiRequests(t *testing.T) map[string]float64 {
	t.Helper()
	out, err := env.APIRequests(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func diff(before, after map[string]float64, keys ...string) map[string]float64 {
	d := map[string]float64{}
	for _, k := range keys {
		if n := after[k] - before[k]; n != 0 {
			d[k] = n
		}
	}
	return d
}

// TestWhatAnAcquireCostsWithBoundObjects counts, from kube-apiserver's own
// metrics, the requests of one acquire of a free slot by the manager
// (route, gated pods) with 0, 1 and 10 objects bound to the slot: one
// create of the permit, one GET of the slot's QueenLockFence (served from
// etcd: a 404 when nothing was ever bound) and one patch per bound object.
// A repeat acquire (already) sends the patches again, and stores nothing.
func TestWhatAnAcquireCostsWithBoundObjects(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t, "cost")
	fence, err := manager.NewFence(env.Config, nil)
	if err != nil {
		t.Fatal(err)
	}
	// As the manager runs it: its cache tells a limit-1 acquire that the
	// lock has no slot above 0, so no list of the lock's permits follows.
	l := locks.New(env.Client, nil, locks.WithGrace(env.Grace), locks.WithFence(fence), locks.WithVersions(locks.CachedVersions(env.Manager.GetCache())))
	keys := []string{"POST queenlocks", "PUT queenlocks", "PATCH queenlocks", "DELETE queenlocks", "GET queenlocks", "LIST queenlocks",
		"LIST configmaps", "LIST secrets", "PATCH configmaps", "GET configmaps", "PATCH secrets", "GET queenlockfences", "LIST queenlockfences"}
	for _, k := range []int{0, 1, 10} {
		lock := fmt.Sprintf("cost-%d", k)
		first, err := l.Acquire(ctx, ns, lock, "setup", 600, 1)
		if err != nil || !first.Acquired {
			t.Fatal(first, err)
		}
		for i := range k {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%d", lock, i),
				Labels:      map[string]string{permit.GuardedLabel: "true"},
				Annotations: map[string]string{permit.GuardAnnotation: permit.Guard{Lock: lock, Token: first.Token}.String()}}}
			if err := env.Client.Create(ctx, cm); err != nil {
				t.Fatal(err)
			}
		}
		if ok, err := l.Release(ctx, ns, lock, 0, first.Token, "setup"); err != nil || !ok {
			t.Fatal(ok, err)
		}
		before := apiRequests(t)
		a, err := l.Acquire(ctx, ns, lock, "a", 600, 1)
		if err != nil || !a.Acquired {
			t.Fatal(a, err)
		}
		got := diff(before, apiRequests(t), keys...)
		// The create and one read of the slot's fence.
		want := map[string]float64{"POST queenlocks": 1, "GET queenlockfences": 1}
		if k > 0 {
			want["PATCH configmaps"] = float64(k)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%d bound: requests %v, want %v", k, got, want)
		}
		t.Logf("acquire of a free slot with %d bound objects: %v", k, got)
		before = apiRequests(t)
		if again, err := l.Acquire(ctx, ns, lock, "a", 600, 1); err != nil || !again.Already {
			t.Fatal(again, err)
		}
		t.Logf("repeat acquire (already), %d bound: %v", k, diff(before, apiRequests(t), keys...))
	}
}
