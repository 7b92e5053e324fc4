package webhook_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/permit"
)

func guarded(ns, name, guard, value string) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{permit.GuardedLabel: "true"}},
		Data:       map[string]string{"report": value},
	}
	if guard != "" {
		cm.Annotations = map[string]string{permit.GuardAnnotation: guard}
	}
	return cm
}

// write stores value in the ConfigMap under guard, as a holder would: read,
// change, update.
func write(ctx context.Context, ns, name, guard, value string) error {
	cm := &corev1.ConfigMap{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cm); err != nil {
		return err
	}
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[permit.GuardAnnotation] = guard
	cm.Data["report"] = value
	return env.Client.Update(ctx, cm)
}

func stored(t *testing.T, ns, name string) *corev1.ConfigMap {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, cm); err != nil {
		t.Fatal(err)
	}
	return cm
}

func refusedWith(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("admitted; want a refusal containing %q", parts)
	}
	for _, p := range append(parts, "kv_precondition") {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("refusal %q does not say %q", err, p)
		}
	}
}

func TestAReplacedHolderCannotCommit(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	// A acquires with a short lifetime and is "paused" past it.
	a := newPermit(ns, "report", 0, 1, "a", 1)
	if err := env.Client.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	guardA := fmt.Sprintf("report#0=%d", token(t, a))
	if err := env.Client.Create(ctx, guarded(ns, "out", guardA, "by A, first")); err != nil {
		t.Fatalf("A's first guarded write: %v", err)
	}
	waitExpired(t, a)
	// B takes the lock over and writes, many times under one token.
	b := a.DeepCopy()
	b.Spec.AcquireTime, b.Spec.Owner, b.Spec.TTLSeconds = nil, "b", 30
	if err := env.Client.Update(ctx, b); err != nil {
		t.Fatal(err)
	}
	guardB := fmt.Sprintf("report#0=%d", token(t, b))
	for i := range 3 {
		if err := write(ctx, ns, "out", guardB, fmt.Sprint("by B ", i)); err != nil {
			t.Fatalf("B's write %d: %v", i, err)
		}
	}
	if got := stored(t, ns, "out").Annotations[permit.FenceAnnotation]; got != guardB {
		t.Fatalf("recorded fence %q, want B's guard %s", got, guardB)
	}
	// A wakes up and writes with its old token: refused, nothing of it stored.
	refusedWith(t, write(ctx, ns, "out", guardA, "by A, late"), `"report"`, guardA)
	if got := stored(t, ns, "out").Data["report"]; got != "by B 2" {
		t.Fatalf("stored %q after A's late write", got)
	}
	// Even if the permit were A's again... a lower token than the object has
	// recorded never passes: re-creating a lock hands out higher tokens only,
	// so the fence rule alone holds A's write back. Check the rule with a
	// write whose token is below the fence while B's permit is gone.
	if err := env.Client.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	refusedWith(t, write(ctx, ns, "out", guardA, "by A, after release"), "report")
}

func TestGuardRefusals(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	p := newPermit(ns, "gate", 0, 1, "me", 30)
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	tok := token(t, p)
	if err := env.Client.Create(ctx, guarded(ns, "cm", fmt.Sprintf("gate#0=%d", tok), "ok")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ guard, says string }{
		{fmt.Sprintf("gate#0=%d", tok+1000), "not held with token"},
		{fmt.Sprintf("gate#1=%d", tok), `bound to lock "gate" slot 0`},
		{fmt.Sprintf("nobody#0=%d", tok), `bound to lock "gate" slot 0`},
		{"gate-0-12", "no '#'"},
		{"gate#0", "no '='"},
		{"gate#x=5", "slot"},
		{"gate#0=abc", "token"},
		{"gate#0=-1", "token"},
		{"#0=5", "lock name"},
	} {
		err := write(ctx, ns, "cm", c.guard, "bad")
		refusedWith(t, err, c.says)
		// A refusal never tells the holder's token (nor the record, a
		// holder's token too): a stale writer would learn a valid guard.
		if namesToken(err, c.guard, tok) {
			t.Fatalf("the refusal of %q names the current token %d: %v", c.guard, tok, err)
		}
	}
	// Nor does the refusal of a token below the record.
	below := fmt.Sprintf("gate#0=%d", tok-1)
	if err := write(ctx, ns, "cm", below, "bad"); err == nil || namesToken(err, below, tok) {
		t.Fatalf("the refusal of a token below the record: %v, want one that does not name token %d", err, tok)
	}
	// A write without the guard to an object that has a fence is refused.
	cm := stored(t, ns, "cm")
	delete(cm.Annotations, permit.GuardAnnotation)
	refusedWith(t, env.Client.Update(ctx, cm), "needs its own annotation")
	// A forged record is replaced by the one the guard makes.
	cm = stored(t, ns, "cm")
	cm.Annotations[permit.FenceAnnotation] = "other#3=1"
	cm.Annotations[permit.GuardAnnotation] = fmt.Sprintf("gate#0=%d", tok)
	if err := env.Client.Update(ctx, cm); err != nil {
		t.Fatalf("the webhook should record the fence over a forged one: %v", err)
	}
	if got := stored(t, ns, "cm").Annotations[permit.FenceAnnotation]; got != fmt.Sprintf("gate#0=%d", tok) {
		t.Fatalf("fence %q after a forged one, want gate#0=%d", got, tok)
	}
	if got := stored(t, ns, "cm").Data["report"]; got != "ok" {
		t.Fatalf("refused writes changed the object: %q", got)
	}
	// Secrets are guarded the same way.
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s",
		Labels:      map[string]string{permit.GuardedLabel: "true"},
		Annotations: map[string]string{permit.GuardAnnotation: fmt.Sprintf("gate#0=%d", tok+1)}}}
	refusedWith(t, env.Client.Create(ctx, sec), "gate")
}

func TestUnlabelledObjectsNeverReachTheWebhook(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	// A nonsense guard on an object that did not opt in is not looked at.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain",
		Annotations: map[string]string{permit.GuardAnnotation: "not a guard"}}}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatalf("an unlabelled object was sent to the guard webhook: %v", err)
	}
	if _, ok := stored(t, ns, "plain").Annotations[permit.FenceAnnotation]; ok {
		t.Fatal("the mutating webhook saw an unlabelled object")
	}
	// And the installed configurations say why: every guard webhook selects
	// on the label.
	var mw admissionregistrationv1.MutatingWebhookConfigurationList
	var vw admissionregistrationv1.ValidatingWebhookConfigurationList
	if err := env.Client.List(ctx, &mw); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.List(ctx, &vw); err != nil {
		t.Fatal(err)
	}
	var selectors []*metav1.LabelSelector
	for _, c := range mw.Items {
		for _, w := range c.Webhooks {
			if strings.Contains(w.Name, "guarded") {
				selectors = append(selectors, w.ObjectSelector)
			}
		}
	}
	for _, c := range vw.Items {
		for _, w := range c.Webhooks {
			// Scale writes carry no labels, so that webhook selects none;
			// its rules name only scale subresources, never the objects.
			if w.Name == "vguarded-scale.locks.queen.dev" {
				for _, r := range w.Rules {
					for _, res := range r.Resources {
						if !strings.HasSuffix(res, "/scale") {
							t.Errorf("the scale webhook, which selects no label, matches %q", res)
						}
					}
				}
				continue
			}
			if strings.Contains(w.Name, "guarded") {
				selectors = append(selectors, w.ObjectSelector)
			}
		}
	}
	if len(selectors) != 3 {
		t.Fatalf("%d guard webhooks selecting by label installed, want 3", len(selectors))
	}
	for _, s := range selectors {
		if s == nil || s.MatchLabels[permit.GuardedLabel] != "true" {
			t.Fatalf("guard webhook selector %v does not require %s=true", s, permit.GuardedLabel)
		}
	}
}

// namesToken tells whether err, less the guard the writer sent, names tok.
func namesToken(err error, sent string, tok uint64) bool {
	rest := strings.ReplaceAll(err.Error(), sent, "")
	return regexp.MustCompile(`\b` + fmt.Sprint(tok) + `\b`).MatchString(rest)
}
