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

	// A renew keeps the holder's pod and the holding's first token; each
	// refusal names the check that failed.
	renewWith := func(change func(*locksv1alpha1.QueenLock)) error {
		p := held.DeepCopy()
		p.Spec.RenewTime, p.Spec.ExpireTime = at(12*time.Second), at(42*time.Second)
		change(p)
		return c.Update(ctx, p)
	}
	const podKept, tokenKept = "holderPod cannot change on a renew", "firstToken is stamped by the admission webhook"
	refused(renewWith(func(p *locksv1alpha1.QueenLock) {
		p.Spec.HolderPod = &locksv1alpha1.PodRef{Namespace: "default", Name: "job-1", UID: "uid-1"}
	}), podKept)
	// No first token recorded yet: the first renew records one.
	if err := renewWith(func(p *locksv1alpha1.QueenLock) { p.Spec.FirstToken = 7 }); err != nil {
		t.Fatalf("the first renew recording its first token: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(held), held); err != nil {
		t.Fatal(err)
	}
	renewWith = func(change func(*locksv1alpha1.QueenLock)) error {
		p := held.DeepCopy()
		p.Spec.RenewTime, p.Spec.ExpireTime = at(14*time.Second), at(44*time.Second)
		change(p)
		return c.Update(ctx, p)
	}
	refused(renewWith(func(p *locksv1alpha1.QueenLock) { p.Spec.FirstToken = 8 }), tokenKept)
	refused(renewWith(func(p *locksv1alpha1.QueenLock) { p.Spec.FirstToken = 0 }), tokenKept)
	refused(renewWith(func(p *locksv1alpha1.QueenLock) { p.Spec.Owner = "thief"; p.Spec.FirstToken = 8 }), notTransition)
	// The leader election fields (package election) are the holding's.
	const electionKept = "leaderTransitions, preferredHolder and strategy cannot change on a renew"
	refused(renewWith(func(p *locksv1alpha1.QueenLock) { p.Spec.LeaderTransitions = 1 }), electionKept)
	refused(renewWith(func(p *locksv1alpha1.QueenLock) { p.Spec.PreferredHolder = "b" }), electionKept)
	refused(renewWith(func(p *locksv1alpha1.QueenLock) { p.Spec.Strategy = "OldestEmulationVersion" }), electionKept)

	// An update that leaves the spec as it is passes (the webhook decides
	// which of those to admit).
	same := held.DeepCopy()
	same.Annotations = map[string]string{"note": "unchanged spec"}
	if err := c.Update(ctx, same); err != nil {
		t.Fatalf("an update that leaves the spec as it is: %v", err)
	}
	held = same

	// A takeover after expiry (the renew that recorded the first token
	// moved it to 42 s), which may name another pod and drops the first
	// token.
	p := held.DeepCopy()
	p.Spec.AcquireTime, p.Spec.RenewTime, p.Spec.ExpireTime, p.Spec.Owner = at(45*time.Second), at(45*time.Second), at(75*time.Second), "b"
	p.Spec.HolderPod = &locksv1alpha1.PodRef{Namespace: "default", Name: "job-2", UID: "uid-2"}
	p.Spec.FirstToken = 0
	p.Spec.LeaderTransitions = 2 // a count is a history: it grows by one at most
	refused(c.Update(ctx, p), "leaderTransitions may only stay or grow by one on a takeover")
	p.Spec.LeaderTransitions = 1
	if err := c.Update(ctx, p); err != nil {
		t.Fatalf("takeover: %v", err)
	}
}
