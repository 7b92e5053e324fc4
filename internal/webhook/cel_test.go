package webhook_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/controlplane"
)

// The CRD's CEL rules re-check every write after the mutating webhook,
// inside the API server. To see them alone, this test installs the CRD on a
// control plane with no webhook at all and writes times by hand.
func TestCRDRulesRecheckEveryWrite(t *testing.T) {
	ctx := context.Background()
	bare, err := controlplane.Start(controlplane.Options{Bare: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = bare.Stop() }()
	raw, err := os.ReadFile(filepath.Join(controlplane.Root(), "config", "crd", "bases", "locks.queen.dev_queenlocks.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(raw, &crd.Object); err != nil {
		t.Fatal(err)
	}
	if err := bare.Client.Create(ctx, crd); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(bare.Config, client.Options{Scheme: bare.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return c.List(ctx, &locksv1alpha1.QueenLockList{}) == nil, nil
	}); err != nil {
		t.Fatal("the CRD was not served")
	}
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *metav1.MicroTime { m := metav1.NewMicroTime(t0.Add(d)); return &m }
	permitAt := func(acquire, renew, expire time.Duration, owner string) *locksv1alpha1.QueenLock {
		return &locksv1alpha1.QueenLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cel.0"},
			Spec: locksv1alpha1.QueenLockSpec{Lock: "cel", Limit: 1, Owner: owner, TTLSeconds: 30,
				AcquireTime: at(acquire), RenewTime: at(renew), ExpireTime: at(expire)},
		}
	}
	refused := func(err error, says string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), says) {
			t.Fatalf("err %v, want a refusal saying %q", err, says)
		}
	}
	unstamped := permitAt(0, 0, 0, "a")
	unstamped.Spec.AcquireTime, unstamped.Spec.RenewTime, unstamped.Spec.ExpireTime = nil, nil, nil
	refused(c.Create(ctx, unstamped), "stamped by the admission webhook")
	refused(c.Create(ctx, permitAt(0, 0, time.Hour, "a")), "expireTime must be renewTime plus ttlSeconds")

	held := permitAt(0, 0, 30*time.Second, "a")
	if err := c.Create(ctx, held); err != nil {
		t.Fatal(err)
	}
	write := func(acquire, renew time.Duration, owner string) error {
		p := held.DeepCopy()
		p.Spec.AcquireTime, p.Spec.RenewTime, p.Spec.ExpireTime, p.Spec.Owner = at(acquire), at(renew), at(renew+30*time.Second), owner
		return c.Update(ctx, p)
	}
	const notTransition = "not a lock transition"
	refused(write(0, 10*time.Second, "thief"), notTransition)          // renew by another owner
	refused(write(0, 30*time.Second, "a"), notTransition)              // renew at expiry
	refused(write(0, -time.Second, "a"), notTransition)                // renew that moves back
	refused(write(10*time.Second, 10*time.Second, "b"), notTransition) // takeover before expiry
	refused(write(31*time.Second, 32*time.Second, "b"), notTransition) // takeover whose times disagree
	if err := write(0, 10*time.Second, "a"); err != nil {              // renew
		t.Fatalf("renew: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(held), held); err != nil {
		t.Fatal(err)
	}
	if err := write(40*time.Second, 40*time.Second, "b"); err != nil { // takeover after expiry
		t.Fatalf("takeover: %v", err)
	}
}
