package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/internal/metricstest"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/webhook"
)

// webhookCalls is how many admission reviews the permit webhook has
// answered in this process.
func webhookCalls(t *testing.T) float64 {
	t.Helper()
	m := metricstest.Series(t, "controller_runtime_webhook_requests_total", map[string]string{"webhook": webhook.MutatePath, "code": "200"})
	if m == nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// The manager's creates, renews and takeovers, stamped by the manager
// itself, skip the permit webhook under the manager's own identity (the
// matchConditions installs put on it, and the admission policy that removes
// a create's managedFields), and are stored as the webhook would have
// stamped them. Its updates without a new stamp and everybody else's writes
// still go through the webhook, and the CRD's CEL rules check the manager's
// writes all the same.
func TestTheManagersStampedWritesSkipTheWebhook(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	clk := clocktesting.NewFakeClock(time.Now())
	e, err := controlplane.Start(controlplane.Options{ManagerConfig: controlplane.AsManagerServiceAccount, Clock: clk, NoExpiry: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Stop() }()
	ctx := context.Background()
	ns := e.Namespace(t, "skip")
	mcfg, err := controlplane.AsManagerServiceAccount(e)
	if err != nil {
		t.Fatal(err)
	}
	mc, err := client.NewWithWatch(mcfg, client.Options{Scheme: manager.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	asManager := locks.New(mc, clk, locks.WithGrace(e.Grace), locks.AsManager())
	stored := func(name string) *locksv1alpha1.QueenLock {
		t.Helper()
		p := &locksv1alpha1.QueenLock{}
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p); err != nil {
			t.Fatal(err)
		}
		return p
	}

	calls := webhookCalls(t)
	a, err := asManager.Acquire(ctx, ns, "job", "one", 30, 1)
	if err != nil || !a.Acquired {
		t.Fatalf("acquire: %+v %v", a, err)
	}
	if got := webhookCalls(t); got != calls {
		t.Fatalf("the manager's create made %v webhook calls, want none", got-calls)
	}
	// Stored as the webhook stamps a create, and without the managedFields
	// kube-apiserver records on every create: the admission policy
	// (config/default/manager_creates.yaml) removes them.
	created := stored("job.0")
	at := clk.Now().UTC().Truncate(time.Microsecond)
	if !created.Spec.AcquireTime.Time.Equal(at) || !created.Spec.RenewTime.Time.Equal(at) || !created.Spec.ExpireTime.Time.Equal(at.Add(30*time.Second)) {
		t.Fatalf("created permit: acquireTime %v renewTime %v expireTime %v, want %v, %v, %v",
			created.Spec.AcquireTime, created.Spec.RenewTime, created.Spec.ExpireTime, at, at, at.Add(30*time.Second))
	}
	if created.Labels[permit.LockLabel] != permit.LabelValue("job") || len(created.ManagedFields) != 0 {
		t.Fatalf("created permit: labels %v, %d managedFields entries (want the lock label and none)", created.Labels, len(created.ManagedFields))
	}

	// A renew: no webhook call, and stored as the webhook stamps one.
	clk.Step(5 * time.Second)
	calls = webhookCalls(t)
	r, err := asManager.Renew(ctx, ns, "job", 0, a.Token, "one", 60)
	if err != nil || !r.Renewed || r.Token <= a.Token {
		t.Fatalf("renew: %+v %v (acquired with token %d)", r, err, a.Token)
	}
	if got := webhookCalls(t); got != calls {
		t.Fatalf("the manager's renew made %v webhook calls, want none", got-calls)
	}
	p := stored("job.0")
	want := clk.Now().UTC().Truncate(time.Microsecond)
	if !p.Spec.RenewTime.Time.Equal(want) || !p.Spec.ExpireTime.Time.Equal(want.Add(60*time.Second)) || p.Spec.TTLSeconds != 60 {
		t.Fatalf("renewed permit: renewTime %v expireTime %v ttl %d, want %v, %v, 60", p.Spec.RenewTime, p.Spec.ExpireTime, p.Spec.TTLSeconds, want, want.Add(60*time.Second))
	}
	if p.Spec.FirstToken != int64(a.Token) || len(p.ManagedFields) != 0 {
		t.Fatalf("renewed permit: firstToken %d (want %d), %d managedFields entries (want none)", p.Spec.FirstToken, a.Token, len(p.ManagedFields))
	}

	// A takeover of the expired permit: neither the create that finds the
	// name taken nor the update that takes it over calls the webhook.
	clk.Step(61*time.Second + e.Grace)
	calls = webhookCalls(t)
	b, err := asManager.Acquire(ctx, ns, "job", "two", 30, 1)
	if err != nil || !b.Acquired || b.Token <= r.Token {
		t.Fatalf("takeover: %+v %v", b, err)
	}
	if got := webhookCalls(t); got != calls {
		t.Fatalf("the manager's takeover made %v webhook calls, want none", got-calls)
	}
	if p := stored("job.0"); p.Spec.Owner != "two" || !p.Spec.AcquireTime.Time.Equal(clk.Now().UTC().Truncate(time.Microsecond)) || p.Spec.FirstToken != 0 {
		t.Fatalf("taken over permit: owner %q acquireTime %v firstToken %d", p.Spec.Owner, p.Spec.AcquireTime, p.Spec.FirstToken)
	}

	// An update of the manager's that carries no new stamp (an older
	// manager's renew, during an upgrade) is stamped by the webhook.
	clk.Step(time.Second)
	calls = webhookCalls(t)
	old := stored("job.0")
	patch := fmt.Sprintf(`{"metadata":{"resourceVersion":%q},"spec":{"owner":"two"}}`, old.ResourceVersion)
	p = &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "job.0"}}
	if err := mc.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	if got := webhookCalls(t); got != calls+1 {
		t.Fatalf("the manager's unstamped renew made %v webhook calls, want 1", got-calls)
	}
	if !p.Spec.RenewTime.After(old.Spec.RenewTime.Time) {
		t.Fatalf("the manager's unstamped renew was stored unstamped: renewTime %v, before it %v", p.Spec.RenewTime, old.Spec.RenewTime)
	}

	// The CEL rules still check a stamped update of the manager's.
	bad := p.DeepCopy()
	bad.Spec.RenewTime = &metav1.MicroTime{Time: p.Spec.RenewTime.Add(time.Second)}
	if err := mc.Update(ctx, bad); err == nil || !strings.Contains(err.Error(), "expireTime must be renewTime plus ttlSeconds") {
		t.Fatalf("a stamped update of the manager's with a wrong expireTime: %v, want the CEL rule's refusal", err)
	}
	bad = p.DeepCopy()
	bad.Spec.Owner = "three"
	bad.Spec.RenewTime = &metav1.MicroTime{Time: p.Spec.RenewTime.Add(time.Second)}
	bad.Spec.ExpireTime = &metav1.MicroTime{Time: bad.Spec.RenewTime.Add(30 * time.Second)}
	if err := mc.Update(ctx, bad); err == nil || !strings.Contains(err.Error(), "not a lock transition") {
		t.Fatalf("a stamped renew of the manager's under another owner: %v, want the CEL rule's refusal", err)
	}

	// The administrator's stamped renew is not the manager's: the webhook
	// sees it and stamps the times from its own clock.
	clk.Step(time.Second)
	calls = webhookCalls(t)
	admin := p.DeepCopy()
	admin.Spec.RenewTime = &metav1.MicroTime{Time: p.Spec.RenewTime.Add(2 * time.Second)}
	admin.Spec.ExpireTime = &metav1.MicroTime{Time: admin.Spec.RenewTime.Add(30 * time.Second)}
	if err := e.Client.Update(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if got := webhookCalls(t); got != calls+1 {
		t.Fatalf("the administrator's stamped renew made %v webhook calls, want 1", got-calls)
	}
	if want := clk.Now().UTC().Truncate(time.Microsecond); !admin.Spec.RenewTime.Time.Equal(want) {
		t.Fatalf("the administrator's renew was stored with renewTime %v, want the webhook's %v", admin.Spec.RenewTime, want)
	}

	// While the policy has no schema of the CRD (seconds after it is
	// installed), kube-apiserver answers a stamped create of the manager's
	// with 503, as here: the manager sends it again unstamped, and the
	// webhook stamps it.
	var creates []bool // whether each create carried a renewTime
	unavailable := interceptor.NewClient(mc, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			stamped := obj.(*locksv1alpha1.QueenLock).Spec.RenewTime != nil
			creates = append(creates, stamped)
			if stamped {
				return apierrors.NewServiceUnavailable("Resource kind locks.queen.dev/v1alpha1, Kind=QueenLock not found. There can be a delay between when CustomResourceDefinitions are created and when they are available.")
			}
			return c.Create(ctx, obj, opts...)
		},
	})
	calls = webhookCalls(t)
	f, err := locks.New(unavailable, clk, locks.WithGrace(e.Grace), locks.AsManager()).Acquire(ctx, ns, "early", "one", 30, 1)
	if err != nil || !f.Acquired {
		t.Fatalf("an acquire whose stamped create got 503: %+v %v", f, err)
	}
	if len(creates) != 2 || !creates[0] || creates[1] {
		t.Fatalf("creates sent (stamped or not): %v, want a stamped one, then an unstamped one", creates)
	}
	if got := webhookCalls(t); got != calls+1 {
		t.Fatalf("the unstamped create made %v webhook calls, want 1", got-calls)
	}
	early := stored("early.0")
	at = clk.Now().UTC().Truncate(time.Microsecond)
	if !early.Spec.AcquireTime.Time.Equal(at) || !early.Spec.ExpireTime.Time.Equal(at.Add(30*time.Second)) || len(early.ManagedFields) != 0 {
		t.Fatalf("the permit created after a 503: acquireTime %v expireTime %v, %d managedFields entries; want %v, %v, none",
			early.Spec.AcquireTime, early.Spec.ExpireTime, len(early.ManagedFields), at, at.Add(30*time.Second))
	}
}

// Where the webhook still sees the manager's stamped writes (here the
// manager runs as the administrator, whom the configuration does not let
// past), it takes them as the transitions they are and stamps them again:
// a renew, and a takeover that arrives with its new acquireTime already
// set rather than cleared.
func TestTheManagersStampedWritesPassTheWebhookToo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	clk := clocktesting.NewFakeClock(time.Now())
	e, err := controlplane.Start(controlplane.Options{Clock: clk, NoExpiry: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Stop() }()
	ctx := context.Background()
	ns := e.Namespace(t, "seen")
	asManager := locks.New(e.Client, clk, locks.WithGrace(e.Grace), locks.AsManager())
	a, err := asManager.Acquire(ctx, ns, "job", "one", 30, 1)
	if err != nil || !a.Acquired {
		t.Fatalf("acquire: %+v %v", a, err)
	}
	clk.Step(5 * time.Second)
	calls := webhookCalls(t)
	r, err := asManager.Renew(ctx, ns, "job", 0, a.Token, "one", 30)
	if err != nil || !r.Renewed {
		t.Fatalf("renew: %+v %v", r, err)
	}
	if got := webhookCalls(t); got != calls+1 {
		t.Fatalf("the renew made %v webhook calls, want 1: the administrator is not let past", got-calls)
	}
	clk.Step(31*time.Second + e.Grace)
	b, err := asManager.Acquire(ctx, ns, "job", "two", 30, 1)
	if err != nil || !b.Acquired || b.Token <= r.Token {
		t.Fatalf("a stamped takeover the webhook sees: %+v %v", b, err)
	}
	p := &locksv1alpha1.QueenLock{}
	if err := e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "job.0"}, p); err != nil {
		t.Fatal(err)
	}
	if now := clk.Now().UTC().Truncate(time.Microsecond); p.Spec.Owner != "two" || !p.Spec.AcquireTime.Time.Equal(now) || p.Spec.FirstToken != 0 {
		t.Fatalf("taken over permit: owner %q acquireTime %v (want %v) firstToken %d", p.Spec.Owner, p.Spec.AcquireTime, now, p.Spec.FirstToken)
	}
}
