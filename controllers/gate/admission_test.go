package gate_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/permit/gatedpod"
)

func TestTheWebhookGatesOnlyLabelledPods(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)

	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain",
		Annotations: map[string]string{gatedpod.LockAnnotation: "nightly"}},
		Spec: corev1.PodSpec{ServiceAccountName: "job", Containers: []corev1.Container{{Name: "c", Image: "c"}}}}
	if err := env.Client.Create(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if gatedpod.Gated(plain) || plain.Annotations[gatedpod.QueuedAt] != "" {
		t.Fatalf("an unlabelled pod was gated: %v %v", plain.Spec.SchedulingGates, plain.Annotations)
	}

	before := time.Now().Add(-time.Second)
	// A creator cannot hand its pod a token: the webhook drops it.
	p := gated(t, ns, "labelled", "nightly", gatedpod.TokenAnnotation, "99999", gatedpod.SlotAnnotation, "0")
	if !gatedpod.Gated(p) {
		t.Fatalf("a labelled pod was not gated: %v", p.Spec.SchedulingGates)
	}
	at, err := time.Parse(gatedpod.TimeFormat, p.Annotations[gatedpod.QueuedAt])
	if err != nil || at.Before(before) || at.After(time.Now().Add(time.Second)) {
		t.Fatalf("queued-at %q: %v", p.Annotations[gatedpod.QueuedAt], err)
	}
	if p.Annotations[gatedpod.TokenAnnotation] != "" || p.Annotations[gatedpod.SlotAnnotation] != "" {
		t.Fatalf("the creator's token and slot were kept: %v", p.Annotations)
	}
}

func TestTheWebhookRefusesBadPodsNamingTheCause(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	for _, c := range []struct {
		name  string
		edit  func(*corev1.Pod)
		cause string
	}{
		{"no lock", func(p *corev1.Pod) { delete(p.Annotations, gatedpod.LockAnnotation) }, "annotation locks.queen.dev/lock is required"},
		{"bad lock", func(p *corev1.Pod) { p.Annotations[gatedpod.LockAnnotation] = "a#b" }, "annotation locks.queen.dev/lock: must not contain '#'"},
		{"bad limit", func(p *corev1.Pod) { p.Annotations[gatedpod.LimitAnnotation] = "many" }, `annotation locks.queen.dev/limit: "many" is not a whole number`},
		{"limit too big", func(p *corev1.Pod) { p.Annotations[gatedpod.LimitAnnotation] = "1025" }, "annotation locks.queen.dev/limit: must be from 1 to 1024"},
		{"bad ttl", func(p *corev1.Pod) { p.Annotations[gatedpod.TTLAnnotation] = "2 hours" }, `annotation locks.queen.dev/ttl: "2 hours" is not a duration`},
		{"ttl too long", func(p *corev1.Pod) { p.Annotations[gatedpod.TTLAnnotation] = "9000h" }, "annotation locks.queen.dev/ttl: must be whole seconds from 1s"},
		{"node name", func(p *corev1.Pod) { p.Spec.NodeName = "node-1" }, `must not set spec.nodeName ("node-1")`},
		{"unentitled account", func(p *corev1.Pod) { p.Spec.ServiceAccountName = "other" }, `ServiceAccount "other" of namespace "` + ns + `" may not hold locks there (create, update and delete on queenlocks.locks.queen.dev)`},
		{"default account", func(p *corev1.Pod) { p.Spec.ServiceAccountName = "" }, `ServiceAccount "default" of namespace "` + ns + `" may not hold locks there (create, update and delete on queenlocks.locks.queen.dev)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newGated(ns, "bad", "nightly")
			c.edit(p)
			err := env.Client.Create(ctx, p)
			if err == nil || !strings.Contains(err.Error(), c.cause) {
				t.Fatalf("got %v, want a refusal naming %q", err, c.cause)
			}
		})
	}
	var list corev1.PodList
	if err := env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil || len(list.Items) != 0 {
		t.Fatalf("refused pods were stored: %d, %v", len(list.Items), err)
	}
}

// refusedWith waits for the admission policies (which the API server loads
// a moment after they are created) to refuse a write with the message.
func refusedWith(t *testing.T, what, message string, write func() error) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		last = write()
		return last != nil && strings.Contains(last.Error(), message), nil
	})
	if err != nil {
		t.Fatalf("%s: got %v, want a refusal containing %q", what, last, message)
	}
}

func TestOnlyTheManagerLetsAPodIn(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	// The line is busy with a holder, so this pod stays gated.
	holder := gated(t, ns, "holder", "migration")
	admitted(t, ns, "holder")
	waiting := gated(t, ns, "waiting", "migration")
	told(t, waiting, "Waiting", "number 1 in line")

	refusedWith(t, "lifting the gate as the administrator", "only the queen-locks manager removes the scheduling gate", func() error {
		p, _ := get(t, ns, "waiting")
		p.Spec.SchedulingGates = nil
		return env.Client.Update(ctx, p)
	})
	refusedWith(t, "changing the token of an admitted pod", "annotations of a gated pod are set at create and then by the queen-locks manager alone", func() error {
		p, _ := get(t, ns, "holder")
		p.Annotations[gatedpod.TokenAnnotation] = "1"
		return env.Client.Update(ctx, p)
	})
	refusedWith(t, "removing the label", "the label locks.queen.dev/gate of a pod cannot be added, changed or removed", func() error {
		p, _ := get(t, ns, "waiting")
		delete(p.Labels, gatedpod.Label)
		return env.Client.Update(ctx, p)
	})
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "c"}}}}
	if err := env.Client.Create(ctx, plain); err != nil {
		t.Fatal(err)
	}
	refusedWith(t, "labelling a running pod", "the label locks.queen.dev/gate of a pod cannot be added", func() error {
		p, _ := get(t, ns, "plain")
		p.Labels = map[string]string{gatedpod.Label: gatedpod.LabelValue}
		p.Annotations = map[string]string{gatedpod.LockAnnotation: "migration", gatedpod.TokenAnnotation: "1"}
		return env.Client.Update(ctx, p)
	})
	// Other changes to a gated pod (the Job controller's finalizers, a
	// user's own annotations) pass.
	p, _ := get(t, ns, "waiting")
	p.Annotations["team"] = "reports"
	p.Finalizers = append(p.Finalizers, "example.com/keep")
	if err := env.Client.Update(ctx, p); err != nil {
		t.Fatalf("an ordinary update of a gated pod was refused: %v", err)
	}
	p.Finalizers = nil
	if err := env.Client.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	if !gatedpod.Gated(p) {
		t.Fatal("the waiting pod lost its gate")
	}
	finish(t, holder)
	admitted(t, ns, "waiting")
}

func TestTheManagerMayTouchOnlyGatedPodsAndOnlyThus(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + controlplane.ManagerNamespace + ":" + controlplane.ManagerServiceAccount}
	asManager, err := client.New(cfg, client.Options{Scheme: manager.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "c"}}}}
	if err := env.Client.Create(ctx, plain); err != nil {
		t.Fatal(err)
	}
	refusedWith(t, "the manager annotating an unlabelled pod", "may change or delete only pods labelled", func() error {
		return asManager.Patch(ctx, plain, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"locks.queen.dev/token":"1"}}}`)))
	})
	refusedWith(t, "the manager deleting an unlabelled pod", "may change or delete only pods labelled", func() error {
		return asManager.Delete(ctx, plain)
	})
	gated(t, ns, "gated", "deadline")
	p := admitted(t, ns, "gated")
	refusedWith(t, "the manager labelling", "may change only the locks.queen.dev/ annotations", func() error {
		return asManager.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"extra":"x"}}}`)))
	})
	if err := asManager.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"activeDeadlineSeconds":100}}`))); err != nil {
		t.Fatalf("the manager may set a deadline: %v", err)
	}
	// The API server refuses a raise itself; the policy says the same for
	// every API server version.
	refusedWith(t, "the manager raising a deadline", "activeDeadlineSeconds", func() error {
		return asManager.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"activeDeadlineSeconds":200}}`)))
	})
	if err := asManager.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"activeDeadlineSeconds":50}}`))); err != nil {
		t.Fatalf("the manager may lower a deadline: %v", err)
	}
	// Through status, its own condition and nothing else.
	status := func(patch string) error {
		return asManager.Status().Patch(ctx, p, client.RawPatch(types.StrategicMergePatchType, []byte(patch)))
	}
	if err := status(`{"status":{"conditions":[{"type":"locks.queen.dev/Admitted","status":"False","reason":"NotAdmitted","message":"m"}]}}`); err != nil {
		t.Fatalf("the manager may set its condition: %v", err)
	}
	refusedWith(t, "the manager setting another condition", "only set its own locks.queen.dev/ conditions", func() error {
		return status(`{"status":{"conditions":[{"type":"Ready","status":"True"}]}}`)
	})
	refusedWith(t, "the manager setting the phase", "only set its own locks.queen.dev/ conditions", func() error {
		return status(`{"status":{"phase":"Succeeded"}}`)
	})
	refusedWith(t, "the manager setting a condition of an unlabelled pod", "may change or delete only pods labelled", func() error {
		return asManager.Status().Patch(ctx, plain, client.RawPatch(types.StrategicMergePatchType, []byte(`{"status":{"conditions":[{"type":"locks.queen.dev/Admitted","status":"False"}]}}`)))
	})
}
