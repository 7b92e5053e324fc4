package gate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/queen-locks/queen-locks/controllers/gate"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/permit/gatedpod"
)

// annotate adds n ordinary annotations to the pod, as its owner may after
// create (the admission policies guard only locks.queen.dev/ ones).
func annotate(t *testing.T, p *corev1.Pod, n int) {
	t.Helper()
	ann := map[string]string{}
	for i := range n {
		ann[fmt.Sprintf("example.com/a%05d", i)] = "x"
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		t.Fatal(err)
	}
	if err := atkMerge(t, env.Client, p, string(patch)); err != nil {
		t.Fatalf("annotating pod %s: %v", p.Name, err)
	}
}

// condition waits until the pod carries the Admitted condition with status
// and answers it.
func condition(t *testing.T, ns, name string, status corev1.ConditionStatus) corev1.PodCondition {
	t.Helper()
	var got corev1.PodCondition
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		p, _ := get(t, ns, name)
		for _, c := range p.Status.Conditions {
			if c.Type == gate.AdmittedCondition && c.Status == status {
				got = c
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s never had condition %s=%s", name, gate.AdmittedCondition, status)
	}
	return got
}

// A pod that cannot be let in (here: given more annotations after create
// than the manager's admission policy compares) is told why, with an event
// and a condition, gives back the slot it took, and holds nobody back: the
// pod behind it, carrying 1,500 ordinary annotations (past what CEL's cost
// limit allowed the policy to compare one by one), is let in.
func TestAPodThatCannotBeLetInHoldsNobodyBack(t *testing.T) {
	ns := entitledNamespace(t)
	first := gated(t, ns, "first", "stuffed")
	first = admitted(t, ns, first.Name)
	stuffed := gated(t, ns, "stuffed", "stuffed")
	told(t, stuffed, "Waiting", "number 1 in line")
	annotate(t, stuffed, 12000)
	behind := gated(t, ns, "behind", "stuffed")
	annotate(t, behind, 1500)
	told(t, behind, "Waiting", "number 2 in line")

	finish(t, first)
	p := admitted(t, ns, behind.Name)
	told(t, stuffed, "NotAdmitted", "lifting its gate was refused")
	c := condition(t, ns, stuffed.Name, corev1.ConditionFalse)
	t.Logf("%s: %s", c.Reason, c.Message)
	if cur, _ := get(t, ns, stuffed.Name); !gatedpod.Gated(cur) {
		t.Fatal("the stuffed pod was let in")
	}
	if h := heldBy(t, ns, "stuffed", gatedpod.Owner(stuffed)); len(h) != 0 {
		t.Fatalf("the pod that could not be let in still holds %s", h[0].Name)
	}
	if q := permitOf(t, p); q.Spec.Owner != gatedpod.Owner(p) {
		t.Fatalf("the pod behind holds %s of %s", q.Name, q.Spec.Owner)
	}
}

// A termination grace period of 1e10 seconds (as a Duration, nanoseconds,
// it overflows) gives a permit of at most a year, and the pod is let in.
func TestAHugeGracePeriodIsCountedInSeconds(t *testing.T) {
	ns := entitledNamespace(t)
	p := newGated(ns, "slow-to-stop", "grace", gatedpod.TTLAnnotation, "1h")
	grace := int64(1e10)
	p.Spec.TerminationGracePeriodSeconds = &grace
	if err := env.Client.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	q := permitOf(t, admitted(t, ns, p.Name))
	if q.Spec.TTLSeconds != permit.MaxTTLSeconds {
		t.Fatalf("permit ttlSeconds %d, want the longest, %d", q.Spec.TTLSeconds, permit.MaxTTLSeconds)
	}
}

// A pod of limit 1 takes slot 0 when it is free, whoever holds slot 1 (a
// holder of a larger limit): only the slots below its own limit count.
func TestAPodIsLetInWhileASlotBelowItsLimitIsFree(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	l := locks.New(env.Client, nil)
	for i := 0; ; i++ {
		got, err := l.Acquire(ctx, ns, "low", fmt.Sprintf("wide-%d", i), 600, 2)
		if err != nil || !got.Acquired {
			t.Fatal(got, err)
		}
		if got.Slot == 1 {
			break
		}
		if ok, err := l.Release(ctx, ns, "low", got.Slot, got.Token, got.Owner); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	p := gated(t, ns, "narrow", "low")
	if got := admitted(t, ns, p.Name); got.Annotations[gatedpod.SlotAnnotation] != "0" {
		t.Fatalf("let in at slot %s, want 0", got.Annotations[gatedpod.SlotAnnotation])
	}
}

// A gated pod is refused at create past the annotations the manager's
// policy compares, naming the cause, rather than left to wait for nothing.
func TestTooManyAnnotationsAreRefusedAtCreate(t *testing.T) {
	ns := entitledNamespace(t)
	p := newGated(ns, "crowded", "crowded")
	for i := range gatedpod.MaxAnnotations {
		p.Annotations[fmt.Sprintf("example.com/a%05d", i)] = "x"
	}
	err := env.Client.Create(context.Background(), p)
	if err == nil || !strings.Contains(err.Error(), "at most 10000 annotations") {
		t.Fatalf("create with %d annotations: %v, want a refusal naming the count", len(p.Annotations), err)
	}
}

// Through the real API server, the pod webhook's patch leaves what the pod
// carries as it was sent: only the gate and queued-at are added.
func TestGatingLeavesThePodAsSent(t *testing.T) {
	ns := entitledNamespace(t)
	p := newGated(ns, "as-sent", "as-sent", "example.com/keep", "me")
	p.Spec.Hostname, p.Spec.Subdomain = "h", "s"
	p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "A", Value: "1"}}
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/first"}}
	if err := env.Client.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	got, _ := get(t, ns, p.Name)
	gates := fmt.Sprint(got.Spec.SchedulingGates)
	if got.Spec.Hostname != "h" || got.Spec.Subdomain != "s" || len(got.Spec.Containers[0].Env) != 1 ||
		got.Annotations["example.com/keep"] != "me" || got.Annotations[gatedpod.QueuedAt] == "" ||
		gates != "[{example.com/first} {locks.queen.dev/lock}]" {
		t.Fatalf("the pod as stored: gates %s, annotations %v, hostname %q", gates, got.Annotations, got.Spec.Hostname)
	}
}
