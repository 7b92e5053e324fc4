package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/permit"
)

// namespace makes a fresh namespace for one test.
func namespace(t *testing.T) string {
	t.Helper()
	return env.Namespace(t, "wh")
}

func newPermit(ns, lock string, slot, limit int32, owner string, ttl int64) *locksv1alpha1.QueenLock {
	return &locksv1alpha1.QueenLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: permit.Name(lock, int(slot))},
		Spec:       locksv1alpha1.QueenLockSpec{Lock: lock, Slot: slot, Limit: limit, Owner: owner, TTLSeconds: ttl},
	}
}

func token(t *testing.T, p *locksv1alpha1.QueenLock) uint64 {
	t.Helper()
	tok, err := permit.Token(p.ResourceVersion)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func reason(err error) string { return string(apierrors.ReasonForError(err)) }

// waitExpired waits until the server's clock, which is this machine's, has
// passed the permit's expireTime.
func waitExpired(t *testing.T, p *locksv1alpha1.QueenLock) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		// A takeover waits out the manager's grace for clock skew too.
		return permit.Expired(p, time.Now().Add(-env.Grace)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestExactlyOneOfManyCreatesWins(t *testing.T) {
	ns := namespace(t)
	const n = 20
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			errs[i] = env.Client.Create(context.Background(), newPermit(ns, "daily-report", 0, 1, "owner-"+string(rune('a'+i)), 30))
		})
	}
	wg.Wait()
	won := 0
	for i, err := range errs {
		switch {
		case err == nil:
			won++
		case !apierrors.IsAlreadyExists(err):
			t.Errorf("create %d: %v, want AlreadyExists", i, err)
		}
	}
	if won != 1 {
		t.Fatalf("%d creates won, want exactly 1", won)
	}
}

func TestTokensIncreaseAcrossRenewsAndHolders(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	p := newPermit(ns, "tokens", 0, 1, "a", 1)
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	last := token(t, p)
	for range 5 {
		if err := env.Client.Update(ctx, p); err != nil {
			t.Fatalf("renew: %v", err)
		}
		if tok := token(t, p); tok <= last {
			t.Fatalf("renew answered token %d after %d", tok, last)
		} else {
			last = tok
		}
	}
	// The next holder, after a takeover, holds a higher token still.
	waitExpired(t, p)
	p.Spec.AcquireTime, p.Spec.Owner = nil, "b"
	if err := env.Client.Update(ctx, p); err != nil {
		t.Fatalf("takeover: %v", err)
	}
	if tok := token(t, p); tok <= last {
		t.Fatalf("takeover answered token %d after %d", tok, last)
	} else {
		last = tok
	}
	// And after a release and a fresh acquire.
	if err := env.Client.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	q := newPermit(ns, "tokens", 0, 1, "c", 30)
	if err := env.Client.Create(ctx, q); err != nil {
		t.Fatal(err)
	}
	if tok := token(t, q); tok <= last {
		t.Fatalf("a new acquire answered token %d after %d", tok, last)
	}
}

func TestTakeover(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	held := newPermit(ns, "takeover", 0, 1, "a", 30)
	if err := env.Client.Create(ctx, held); err != nil {
		t.Fatal(err)
	}
	steal := held.DeepCopy()
	steal.Spec.AcquireTime, steal.Spec.Owner = nil, "b"
	if err := env.Client.Update(ctx, steal); reason(err) != permit.ReasonHeld {
		t.Fatalf("takeover of a held permit: %v, want reason held", err)
	}
	short := newPermit(ns, "takeover-expired", 0, 1, "a", 1)
	if err := env.Client.Create(ctx, short); err != nil {
		t.Fatal(err)
	}
	before := short.Spec.AcquireTime.Time
	waitExpired(t, short)
	short.Spec.AcquireTime, short.Spec.Owner = nil, "b"
	if err := env.Client.Update(ctx, short); err != nil {
		t.Fatalf("takeover of an expired permit: %v", err)
	}
	if short.Spec.Owner != "b" || !short.Spec.AcquireTime.After(before) || !short.Spec.AcquireTime.Equal(short.Spec.RenewTime) {
		t.Fatalf("takeover stamped %+v", short.Spec)
	}
	// The old holder's renew after the takeover is refused.
	stale := short.DeepCopy()
	stale.Spec.Owner = "a"
	if err := env.Client.Update(ctx, stale); reason(err) != permit.ReasonHeld {
		t.Fatalf("renew by the replaced holder: %v, want reason held", err)
	}
}

func TestRenewAfterExpiryIsLost(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	p := newPermit(ns, "late", 0, 1, "a", 1)
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	waitExpired(t, p)
	if err := env.Client.Update(ctx, p); reason(err) != permit.ReasonLost {
		t.Fatalf("late renew: %v, want reason lost", err)
	}
}

func TestServerStampsTimes(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	p := newPermit(ns, "stamps", 0, 1, "a", 30)
	forged := metav1.NewMicroTime(time.Now().Add(365 * 24 * time.Hour))
	p.Spec.AcquireTime, p.Spec.RenewTime, p.Spec.ExpireTime = &forged, &forged, &forged
	sent := time.Now()
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	got := &locksv1alpha1.QueenLock{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.ExpireTime.Equal(&forged) || got.Spec.ExpireTime.Before(&metav1.MicroTime{Time: sent.Add(29 * time.Second)}) ||
		got.Spec.ExpireTime.After(time.Now().Add(31*time.Second)) {
		t.Fatalf("expireTime %v: the client's time was kept or the server's is wrong", got.Spec.ExpireTime)
	}
	if got.Labels[permit.LockLabel] != "stamps" {
		t.Fatalf("label = %v", got.Labels)
	}
	// A renew that sends a forged expireTime is stamped again too.
	got.Spec.ExpireTime = &forged
	if err := env.Client.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.ExpireTime.Equal(&forged) || got.Spec.ExpireTime.Sub(got.Spec.RenewTime.Time) != 30*time.Second {
		t.Fatalf("renew kept a forged expireTime: %+v", got.Spec)
	}
}

func TestNonTransitionWritesAreRefused(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	p := newPermit(ns, "meta", 0, 1, "a", 30)
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	edit := p.DeepCopy()
	edit.Labels["team"] = "x"
	err := env.Client.Update(ctx, edit)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "metadata.labels") {
		t.Fatalf("label edit: %v, want invalid naming metadata.labels", err)
	}
	// kubectl writes the refusal as The QueenLock "meta.0" is invalid.
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil || status.Status().Details.Name != "meta.0" {
		t.Fatalf("label edit: the refusal's details %+v name no permit, want meta.0", status)
	}
	edit = p.DeepCopy()
	edit.Annotations = map[string]string{"note": "x"}
	if err := env.Client.Update(ctx, edit); !apierrors.IsInvalid(err) {
		t.Fatalf("annotation edit: %v, want invalid", err)
	}
	wrong := newPermit(ns, "meta", 0, 1, "a", 30)
	wrong.Name = "not-the-permit-name"
	if err := env.Client.Create(ctx, wrong); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), `"meta.0"`) {
		t.Fatalf("wrong object name: %v, want invalid naming meta.0", err)
	}
	fin := newPermit(ns, "fin", 0, 1, "a", 30)
	fin.Finalizers = []string{"example.com/keep"}
	if err := env.Client.Create(ctx, fin); !apierrors.IsInvalid(err) {
		t.Fatalf("finalizer on create: %v, want invalid", err)
	}
	for _, bad := range []*locksv1alpha1.QueenLock{
		newPermit(ns, "a#b", 0, 1, "a", 30),
		newPermit(ns, "ok", 0, 1, "a", 0),
		newPermit(ns, "ok", 2, 2, "a", 30),
		newPermit(ns, "ok", 0, 1, "", 30),
	} {
		bad.Name = "whatever"
		if err := env.Client.Create(ctx, bad); err == nil || !apierrors.IsInvalid(err) {
			t.Errorf("create of %+v: %v, want invalid", bad.Spec, err)
		}
	}
	// Nothing of the refused writes is stored.
	got := &locksv1alpha1.QueenLock{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil || got.ResourceVersion != p.ResourceVersion {
		t.Fatalf("refused writes changed the permit: %v, rv %s -> %s", err, p.ResourceVersion, got.ResourceVersion)
	}
}

func TestPatchCannotStealAHeldPermit(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	p := newPermit(ns, "patched", 0, 1, "a", 30)
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	for name, patch := range map[string]string{
		"change owner":       `{"spec":{"owner":"thief"}}`,
		"clear acquireTime":  `{"spec":{"owner":"thief","acquireTime":null}}`,
		"push out expiry":    `{"spec":{"owner":"thief","expireTime":"2099-01-01T00:00:00.000000Z"}}`,
		"move to other slot": `{"spec":{"slot":1,"limit":2}}`,
	} {
		err := env.Client.Patch(ctx, p.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(patch)))
		if err == nil {
			t.Errorf("%s: patch admitted", name)
		}
	}
	// The same through kubectl itself.
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.Env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(controlplane.Root(), "bin", "kubectl"), "--kubeconfig", kubeconfig, "-n", ns,
		"patch", "queenlock", p.Name, "--type=merge", "-p", `{"spec":{"owner":"thief"}}`).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "held") {
		t.Errorf("kubectl patch: err %v, output %s; want a refusal saying held", err, out)
	}
	got := &locksv1alpha1.QueenLock{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil || got.Spec.Owner != "a" || got.ResourceVersion != p.ResourceVersion {
		t.Fatalf("patches changed the permit: owner %q rv %s -> %s (%v)", got.Spec.Owner, p.ResourceVersion, got.ResourceVersion, err)
	}
}

func TestServerSetsTheLockLabelAndKeepsOthers(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	p := newPermit(ns, "labelled", 0, 1, "a", 30)
	p.Labels = map[string]string{"team": "x", permit.LockLabel: "forged"}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	got := &locksv1alpha1.QueenLock{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil {
		t.Fatal(err)
	}
	if got.Labels[permit.LockLabel] != "labelled" || got.Labels["team"] != "x" || len(got.Labels) != 2 {
		t.Fatalf("labels = %v", got.Labels)
	}
	if !got.Spec.AcquireTime.Equal(got.Spec.RenewTime) || got.Spec.ExpireTime.Sub(got.Spec.RenewTime.Time) != 30*time.Second {
		t.Fatalf("times = %+v", got.Spec)
	}
}

// Owners beginning pod: are the gated pods': a write from anyone but the
// manager (kubectl, a handle over the API) that would leave one on a
// permit is refused naming spec.owner, and nothing is stored.
func TestAGatedPodsOwnerIsRefusedToAnyoneButTheManager(t *testing.T) {
	ns := namespace(t)
	grant(t, ns, "holder", "locks.queen.dev", []string{"queenlocks"}, []string{"create", "update", "get"})
	holder := asUser(t, "holder")
	var err error
	// RBAC's informer takes a moment to see the binding.
	if werr := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err = holder.Create(ctx, newPermit(ns, "victim", 0, 1, "pod:0000-victim", 30))
		return !apierrors.IsForbidden(err), nil
	}); werr != nil {
		t.Fatalf("the holder's create stayed forbidden: %v", err)
	}
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.owner") || !strings.Contains(err.Error(), `"pod:"`) {
		t.Fatalf("create as pod:0000-victim: %v, want a refusal naming spec.owner", err)
	}
	var list locksv1alpha1.QueenLockList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil || len(list.Items) != 0 {
		t.Fatalf("stored after the refusal: %v %v", list.Items, err)
	}
}

// The manager keeps every permit in memory, so what a caller may hang on
// one is bounded: labels and annotations past the bound are refused,
// naming the field, at create and at any later write; up to it they are
// kept. An owner with a control character is refused: kubectl get would
// print it to the reader's terminal.
func TestAPermitsMetadataAndOwnerAreBounded(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	grant(t, ns, "holder", "locks.queen.dev", []string{"queenlocks"}, []string{"create", "update", "patch", "get"})
	holder := asUser(t, "holder")
	big := map[string]string{"example.com/notes": strings.Repeat("x", permit.MaxMetadataBytes)}
	p := newPermit(ns, "meta", 0, 1, "a", 300)
	p.Annotations = big
	var err error
	if werr := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err = holder.Create(ctx, p.DeepCopy())
		return !apierrors.IsForbidden(err), nil
	}); werr != nil {
		t.Fatalf("the holder's create stayed forbidden: %v", err)
	}
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "metadata.annotations") || !strings.Contains(err.Error(), "8192") {
		t.Fatalf("a create with %d bytes of annotations: %v, want a refusal naming metadata.annotations and the bound", permit.MaxMetadataBytes+17, err)
	}
	p.Annotations = map[string]string{"example.com/notes": strings.Repeat("x", permit.MaxMetadataBytes-len("example.com/notes"))}
	if err := holder.Create(ctx, p); err != nil {
		t.Fatalf("a create with annotations of exactly the bound: %v", err)
	}
	p.Labels = map[string]string{}
	for i := range 200 {
		p.Labels[fmt.Sprintf("example.com/l%03d", i)] = strings.Repeat("v", 40)
	}
	if err := holder.Update(ctx, p); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "metadata.labels") {
		t.Fatalf("an update with 11 KB of labels: %v, want a refusal naming metadata.labels", err)
	}
	if got := storedPermit(t, ns, p.Name); len(got.Labels) > 1 {
		t.Fatalf("the refused labels were stored: %v", got.Labels)
	}
	ctl := newPermit(ns, "ctl", 0, 1, "a\x1b[2Jb", 300)
	if err := holder.Create(ctx, ctl); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.owner") || !strings.Contains(err.Error(), "U+001B") {
		t.Fatalf("an owner with an escape character: %v, want a refusal naming spec.owner and the character", err)
	}
}
