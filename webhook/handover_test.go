package webhook_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// A handover from outside the manager (a direct client's release,
// kubectl) is judged against the line as the API server has it: one to
// anybody but the head of the line, or with another lifetime than the
// head's, is refused and changes nothing; the head's own is admitted, and
// before it is stored the fence of the slot's bound objects is raised
// past the ending holding, whose writes are refused from then on.
func TestAHandoverFromOutsideTheManagerGoesToTheHeadOnly(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	lc := fencedLocks(t)
	a := acquired(t)(lc.Acquire(ctx, ns, "job", "a", 600, 1))
	grant(t, ns, "dev", "", []string{"configmaps"}, []string{"*"})
	grant(t, ns, "releaser", locksv1alpha1.GroupVersion.Group, []string{"queenlocks"}, []string{"get", "update"})
	dev, releaser := asUser(t, "dev"), asUser(t, "releaser")
	if err := dev.Create(ctx, guarded(ns, "cm", guardOf("job", 0, a.Token), "x")); err != nil {
		t.Fatal(err)
	}
	head := &locksv1alpha1.QueenLockWaiter{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "job-", Labels: map[string]string{permit.LockLabel: permit.LabelValue("job")}},
		Spec:       locksv1alpha1.QueenLockWaiterSpec{Lock: "job", Owner: "b", Limit: 1, TTLSeconds: 6, HoldSeconds: 60, Carrier: "test"},
	}
	if err := env.Client.Create(ctx, head); err != nil {
		t.Fatal(err)
	}
	second := &locksv1alpha1.QueenLockWaiter{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "job-", Labels: head.Labels}, Spec: head.Spec}
	second.Spec.Owner = "c"
	if err := env.Client.Create(ctx, second); err != nil {
		t.Fatal(err)
	}
	held := storedPermit(t, ns, permit.Name("job", 0))
	for _, c := range []struct {
		name string
		edit func(p *locksv1alpha1.QueenLock)
		says string
	}{
		{"to an owner nobody waits as", func(p *locksv1alpha1.QueenLock) { p.Spec.Owner = "thief" }, "head of the line"},
		{"to the second in line", func(p *locksv1alpha1.QueenLock) { p.Spec.Owner, p.Spec.Waiter = "c", second.Name }, "head of the line"},
		{"to the head, for longer than its own ttl", func(p *locksv1alpha1.QueenLock) { p.Spec.TTLSeconds = 3600 }, "ttlSeconds"},
	} {
		t.Run(c.name, func(t *testing.T) {
			forged := permit.Handed(held, head)
			c.edit(forged)
			err := releaser.Update(ctx, forged)
			if err == nil || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("forged handover: %v, want a refusal saying %q", err, c.says)
			}
			if now := storedPermit(t, ns, held.Name); now.ResourceVersion != held.ResourceVersion {
				t.Fatalf("the refused handover changed the permit")
			}
		})
	}
	if got := stored(t, ns, "cm").Annotations[permit.FenceAnnotation]; got != guardOf("job", 0, a.Token) {
		t.Fatalf("fence record %q after refused handovers, want a's %q", got, guardOf("job", 0, a.Token))
	}
	handed := permit.Handed(held, head)
	if err := releaser.Update(ctx, handed); err != nil {
		t.Fatalf("the handover to the head of the line: %v", err)
	}
	tok, err := permit.Token(handed.ResourceVersion)
	if err != nil || tok <= a.Token || handed.Spec.Owner != "b" || handed.Spec.TTLSeconds != 6 {
		t.Fatalf("handed %+v (token %d), want b's, above %d", handed.Spec, tok, a.Token)
	}
	rec, _, err := permit.ParseFence(stored(t, ns, "cm").Annotations[permit.FenceAnnotation])
	if err != nil || rec.Token <= a.Token || rec.Token > tok {
		t.Fatalf("fence record %+v %v: want raised past a's %d, not past the handover's %d", rec, err, a.Token, tok)
	}
	refusedWith(t, writeAs(ctx, dev, ns, "cm", guardOf("job", 0, a.Token), "a's late write"), "job")
	if err := writeAs(ctx, dev, ns, "cm", guardOf("job", 0, tok), "b's"); err != nil {
		t.Fatalf("the new holder's write: %v", err)
	}
	// The waiter claims it: its acquire answers the handed permit.
	got, err := locks.New(env.Client, nil).Acquire(ctx, ns, "job", "b", 6, 1)
	if err != nil || !got.Acquired || got.Already || got.Token != tok {
		t.Fatalf("the head's acquire: %+v %v, want the handed permit %d", got, err, tok)
	}
}

// writeAs is write by c, a namespace user.
func writeAs(ctx context.Context, c client.Client, ns, name, guard, value string) error {
	cm := &corev1.ConfigMap{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cm); err != nil {
		return err
	}
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[permit.GuardAnnotation] = guard
	cm.Data["report"] = value
	return c.Update(ctx, cm)
}
