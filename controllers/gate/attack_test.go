package gate_test

// Attacks on gated pods (a pod labelled locks.queen.dev/gate that waits
// for its lock before it runs; docs/gated-pods.md), against the real API server and
// the manager under its own identity. Each test either documents behaviour
// that holds (it passes), or is a finding: it asserts what the docs
// promise. An open finding is skipped with t.Skip("FINDING: ...")
// (run them with QUEEN_LOCKS_ATTACK_FINDINGS=1; docs/gated-pods.md says
// what each leaves open); one marked fixedFinding got through once and is
// refused now, and runs always.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit/gatedpod"
)

// finding skips a test that shows a problem, unless the findings are asked
// for: the suite stays green, and the reproduction stays runnable.
// fixedFinding marks an attack that once got through: it runs always.
func fixedFinding(t *testing.T, what string) {
	t.Helper()
	t.Log("was a finding, now refused: " + what)
}

func finding(t *testing.T, what string) {
	t.Helper()
	if os.Getenv("QUEEN_LOCKS_ATTACK_FINDINGS") == "" {
		t.Skip("FINDING: " + what)
	}
	t.Log("FINDING under test: " + what)
}

var atkEditOnce sync.Once

// atkEditRole is the ClusterRole a namespace user is bound to: the built-in
// edit role. With no kube-controller-manager here the clusterrole
// aggregation controller does not run, so edit's rules are filled in as it
// would: the union of every ClusterRole labelled aggregate-to-edit, which
// includes the chart's queen-locks-holder (config/rbac/holder_role.yaml).
func atkEditRole(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	atkEditOnce.Do(func() {
		if err := env.ApplyFile("config/rbac/holder_role.yaml"); err != nil {
			t.Fatal(err)
		}
		var all rbacv1.ClusterRoleList
		if err := env.Client.List(ctx, &all); err != nil {
			t.Fatal(err)
		}
		byName := map[string]rbacv1.ClusterRole{}
		for _, r := range all.Items {
			byName[r.Name] = r
		}
		if _, ok := byName["edit"]; !ok {
			t.Fatal("no built-in edit role")
		}
		// The aggregation, followed through view (aggregated into edit).
		var rules []rbacv1.PolicyRule
		seen := map[string]bool{}
		var resolve func(name string)
		resolve = func(name string) {
			if seen[name] {
				return
			}
			seen[name] = true
			r := byName[name]
			if r.AggregationRule == nil {
				rules = append(rules, r.Rules...)
				return
			}
			for _, sel := range r.AggregationRule.ClusterRoleSelectors {
				for _, o := range all.Items {
					match := true
					for k, v := range sel.MatchLabels {
						if o.Labels[k] != v {
							match = false
						}
					}
					if match {
						resolve(o.Name)
					}
				}
			}
		}
		resolve("edit")
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "attack-edit"}, Rules: rules}
		if err := env.Client.Create(ctx, role); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	})
	return "attack-edit"
}

// atkEditUser is a user bound to the edit role in ns alone, as a client
// that impersonates it.
func atkEditUser(t *testing.T, ns string) (client.Client, string) {
	t.Helper()
	ctx := context.Background()
	user := "alice@" + ns
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "alice-edit"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: atkEditRole(t)},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}}
	if err := env.Client.Create(ctx, rb); err != nil {
		t.Fatal(err)
	}
	c := atkAs(t, user)
	// RBAC's informer takes a moment to see the binding.
	var last error
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var l corev1.PodList
		last = c.List(ctx, &l, client.InNamespace(ns))
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("the edit binding did not take effect: %v", last)
	}
	return c, user
}

func atkAs(t *testing.T, user string, groups ...string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	c, err := client.New(cfg, client.Options{Scheme: manager.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func atkManager(t *testing.T) client.Client {
	t.Helper()
	return atkAs(t, "system:serviceaccount:"+controlplane.ManagerNamespace+":"+controlplane.ManagerServiceAccount)
}

// atkRefused waits for a write to be refused with a message containing
// every one of want (the admission policies load a moment after they are
// created, and RBAC a moment after a binding), and answers the error.
func atkRefused(t *testing.T, what string, write func() error, want ...string) {
	t.Helper()
	_ = atkRefusal(t, what, write, want...)
}

// atkRefusal is atkRefused, answering the refusal.
func atkRefusal(t *testing.T, what string, write func() error, want ...string) error {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		last = write()
		if last == nil {
			return false, nil
		}
		for _, w := range want {
			if !strings.Contains(last.Error(), w) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Errorf("%s: got %v, want a refusal containing %q", what, last, want)
	}
	return last
}

// atkStays checks, for a while, that the pod is still gated.
func atkStays(t *testing.T, ns, name string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		p, ok := get(t, ns, name)
		if !ok {
			t.Fatalf("pod %s is gone", name)
		}
		if !gatedpod.Gated(p) {
			t.Fatalf("pod %s was let in: %v %v", name, p.Spec.SchedulingGates, p.Annotations)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func atkMerge(t *testing.T, c client.Client, p *corev1.Pod, patch string) error {
	t.Helper()
	return c.Patch(context.Background(), p.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(patch)))
}

// atkMergeSub merge-patches a subresource of the pod.
func atkMergeSub(t *testing.T, c client.Client, p *corev1.Pod, sub, patch string) error {
	t.Helper()
	return c.SubResource(sub).Patch(context.Background(), p.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(patch)))
}

// atkBusy makes lock in ns busy with one admitted gated pod and one waiting
// behind it, and answers both.
func atkBusy(t *testing.T, ns, lock string) (holder, waiting *corev1.Pod) {
	t.Helper()
	gated(t, ns, lock+"-holder", lock)
	holder = admitted(t, ns, lock+"-holder")
	waiting = gated(t, ns, lock+"-waiting", lock)
	told(t, waiting, "Waiting", "number 1 in line")
	return holder, waiting
}

// ---------------------------------------------------------------------
// 1. A namespace user with the edit role.
// ---------------------------------------------------------------------

// Everything an edit user can do to a gated pod to make it run without
// its turn, and how each is refused.
func TestAttackEditUserCannotLetAPodIn(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	alice, _ := atkEditUser(t, ns)
	holder, waiting := atkBusy(t, ns, "busy")

	t.Run("remove the gate", func(t *testing.T) {
		atkRefused(t, "merge patch", func() error {
			return atkMerge(t, alice, waiting, `{"spec":{"schedulingGates":null}}`)
		}, "only the queen-locks manager removes the scheduling gate locks.queen.dev/lock")
		atkRefused(t, "json patch", func() error {
			return alice.Patch(ctx, waiting, client.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/spec/schedulingGates/0"}]`)))
		}, "only the queen-locks manager removes the scheduling gate")
		atkRefused(t, "update", func() error {
			p, _ := get(t, ns, waiting.Name)
			p.Spec.SchedulingGates = nil
			return alice.Update(ctx, p)
		}, "only the queen-locks manager removes the scheduling gate")
		// Server-side apply of an empty list leaves the gate, which the
		// applier does not own, in place.
		body := fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q,"namespace":%q},"spec":{"schedulingGates":[],"containers":[{"name":"job","image":"job"}]}}`, waiting.Name, ns)
		err := alice.Patch(ctx, waiting.DeepCopy(), client.RawPatch(types.ApplyPatchType, []byte(body)), client.FieldOwner("alice"), client.ForceOwnership)
		t.Logf("server-side apply of schedulingGates: [] by a non-owner: %v", err)
		atkStays(t, ns, waiting.Name, 0)
		// A pod the user created by apply, whose gate the user's apply
		// then drops.
		mine := fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"applied","namespace":%q,"labels":{%q:"true"},"annotations":{%q:"busy"}},"spec":{"serviceAccountName":"job","schedulingGates":[{"name":"locks.queen.dev/lock"}],"containers":[{"name":"job","image":"job"}]}}`, ns, gatedpod.Label, gatedpod.LockAnnotation)
		ap := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "applied"}}
		if err := alice.Patch(ctx, ap, client.RawPatch(types.ApplyPatchType, []byte(mine)), client.FieldOwner("alice"), client.ForceOwnership); err != nil {
			t.Fatal(err)
		}
		atkRefused(t, "server-side apply dropping its own gate", func() error {
			body := strings.Replace(mine, `"schedulingGates":[{"name":"locks.queen.dev/lock"}],`, "", 1)
			return alice.Patch(ctx, ap.DeepCopy(), client.RawPatch(types.ApplyPatchType, []byte(body)), client.FieldOwner("alice"), client.ForceOwnership)
		}, "only the queen-locks manager removes the scheduling gate")
		atkStays(t, ns, "applied", 0)
	})

	t.Run("remove or change the label", func(t *testing.T) {
		atkRefused(t, "remove", func() error {
			return atkMerge(t, alice, waiting, `{"metadata":{"labels":{"locks.queen.dev/gate":null}}}`)
		}, "the label locks.queen.dev/gate of a pod cannot be added, changed or removed")
		atkRefused(t, "change", func() error {
			return atkMerge(t, alice, waiting, `{"metadata":{"labels":{"locks.queen.dev/gate":"false"}}}`)
		}, "the label locks.queen.dev/gate of a pod cannot be added, changed or removed")
		// Both at once, as a pod that would no longer be a gated pod.
		atkRefused(t, "remove label and gate", func() error {
			return atkMerge(t, alice, waiting, `{"metadata":{"labels":{"locks.queen.dev/gate":null}},"spec":{"schedulingGates":null}}`)
		}, "forbidden")
	})

	t.Run("move the waiting pod to another lock, or the admitted one", func(t *testing.T) {
		for _, p := range []*corev1.Pod{waiting, holder} {
			atkRefused(t, "change the lock of "+p.Name, func() error {
				return atkMerge(t, alice, p, `{"metadata":{"annotations":{"locks.queen.dev/lock":"free-lock"}}}`)
			}, "the locks.queen.dev/ annotations of a gated pod are set at create and then by the queen-locks manager alone")
			atkRefused(t, "raise the limit of "+p.Name, func() error {
				return atkMerge(t, alice, p, `{"metadata":{"annotations":{"locks.queen.dev/limit":"1024"}}}`)
			}, "the locks.queen.dev/ annotations of a gated pod are set at create")
			atkRefused(t, "drop the ttl / queued-at of "+p.Name, func() error {
				return atkMerge(t, alice, p, `{"metadata":{"annotations":{"locks.queen.dev/queued-at":"2000-01-01T00:00:00.000000Z"}}}`)
			}, "the locks.queen.dev/ annotations of a gated pod are set at create")
		}
		atkRefused(t, "set the token on the waiting pod", func() error {
			return atkMerge(t, alice, waiting, `{"metadata":{"annotations":{"locks.queen.dev/token":"1","locks.queen.dev/slot":"0"}}}`)
		}, "the locks.queen.dev/ annotations of a gated pod are set at create")
		atkRefused(t, "change the token of the admitted pod", func() error {
			return atkMerge(t, alice, holder, `{"metadata":{"annotations":{"locks.queen.dev/token":"999999999"}}}`)
		}, "the locks.queen.dev/ annotations of a gated pod are set at create")
	})

	t.Run("create with the token and an early queued-at", func(t *testing.T) {
		p := newGated(ns, "forged", "busy", gatedpod.TokenAnnotation, "999999999", gatedpod.SlotAnnotation, "0",
			gatedpod.AdmittedAt, "2000-01-01T00:00:00.000000Z", gatedpod.QueuedAt, "2000-01-01T00:00:00.000000Z")
		if err := alice.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		if !gatedpod.Gated(p) || p.Annotations[gatedpod.TokenAnnotation] != "" || p.Annotations[gatedpod.SlotAnnotation] != "" || p.Annotations[gatedpod.AdmittedAt] != "" {
			t.Fatalf("a forged pod was stored as %v %v", p.Spec.SchedulingGates, p.Annotations)
		}
		if strings.HasPrefix(p.Annotations[gatedpod.QueuedAt], "2000") {
			t.Fatalf("the creator's queued-at was kept: it would jump the line: %v", p.Annotations)
		}
		told(t, p, "Waiting", "in line")
	})

	t.Run("create without the gate: the webhook adds it", func(t *testing.T) {
		p := newGated(ns, "nogate", "busy")
		if err := alice.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		if !gatedpod.Gated(p) {
			t.Fatalf("stored ungated: %v", p.Spec.SchedulingGates)
		}
	})

	t.Run("claim to be a mirror pod by update", func(t *testing.T) {
		// The policy skips requests whose new object carries the mirror
		// annotation; the API server keeps that annotation immutable.
		atkRefused(t, "add the mirror annotation and drop the gate", func() error {
			return atkMerge(t, alice, waiting, `{"metadata":{"annotations":{"kubernetes.io/config.mirror":"x"}},"spec":{"schedulingGates":null}}`)
		}, "kubernetes.io/config.mirror")
		atkRefused(t, "add the mirror annotation and the token", func() error {
			return atkMerge(t, alice, holder, `{"metadata":{"annotations":{"kubernetes.io/config.mirror":"x","locks.queen.dev/token":"1"}}}`)
		}, "kubernetes.io/config.mirror")
	})

	t.Run("create with nodeName", func(t *testing.T) {
		p := newGated(ns, "bound", "busy")
		p.Spec.NodeName = "node-1"
		atkRefused(t, "nodeName", func() error { return alice.Create(ctx, p.DeepCopy()) },
			`must not set spec.nodeName ("node-1")`, gatedpod.Label)
	})

	t.Run("bind the gated pod", func(t *testing.T) {
		b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: waiting.Name}, Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"}}
		err := alice.SubResource("binding").Create(ctx, waiting, b)
		if !apierrors.IsForbidden(err) {
			t.Fatalf("an edit user bound a pod: %v", err)
		}
		// Not even the administrator (or the scheduler) can bind a pod
		// that has scheduling gates: the API server refuses it.
		err = env.Client.SubResource("binding").Create(ctx, waiting, b)
		if err == nil {
			t.Fatal("the API server bound a gated pod")
		}
		t.Logf("binding a gated pod as the administrator: %v", err)
		atkStays(t, ns, waiting.Name, 0)
	})

	t.Run("ephemeral containers", func(t *testing.T) {
		p, _ := get(t, ns, waiting.Name)
		p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: "debug"}}}
		err := alice.SubResource("ephemeralcontainers").Update(ctx, p)
		t.Logf("an edit user adding an ephemeral container to a waiting pod: %v", err)
		cur, _ := get(t, ns, waiting.Name)
		if !gatedpod.Gated(cur) || cur.Spec.NodeName != "" {
			t.Fatalf("the ephemeral containers update let the pod go: %v", cur.Spec.SchedulingGates)
		}
	})

	t.Run("status", func(t *testing.T) {
		err := atkMergeSub(t, alice, waiting, "status", `{"status":{"phase":"Running"}}`)
		if !apierrors.IsForbidden(err) {
			t.Fatalf("an edit user wrote a pod's status: %v", err)
		}
	})

	t.Run("a namespace the webhook skips", func(t *testing.T) {
		for _, other := range []string{"kube-system", controlplane.ManagerNamespace} {
			p := newGated(other, "skipped", "busy")
			p.Spec.ServiceAccountName = ""
			if err := alice.Create(ctx, p); !apierrors.IsForbidden(err) {
				t.Fatalf("an edit user of %s created a pod in %s: %v", ns, other, err)
			}
		}
	})

	atkStays(t, ns, waiting.Name, time.Second)
	if got := running(t, ns); !slices.Equal(got, []string{holder.Name}) {
		t.Fatalf("let in: %v, want only %s", got, holder.Name)
	}
}

// A label value other than "true" is not a gated pod at all: the pod runs
// at once, holds no permit and carries no token. It is not a way round the
// lock (the lock only holds back pods that opt in), and the webhook does
// not tell the user that the opt-in was misspelt.
func TestAttackMisspeltLabelIsSilentlyUngated(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	alice, _ := atkEditUser(t, ns)
	atkBusy(t, ns, "spelt")
	for _, v := range []string{"True", "yes", "1", " true"} {
		p := newGated(ns, "", "spelt")
		p.GenerateName = "misspelt-"
		p.Labels[gatedpod.Label] = v
		if err := alice.Create(ctx, p); err != nil {
			t.Logf("label %q: refused: %v", v, err)
			continue
		}
		if gatedpod.Gated(p) {
			t.Fatalf("label %q gated the pod", v)
		}
		t.Logf("label %q: created ungated, with annotations %v: it runs beside the lock's holder", v, p.Annotations)
	}
}

// A labelled pod carrying the mirror-pod annotation skips the webhook and
// the policy. The kubelet never runs a mirror pod it did not create, so it
// does not run, but any user can store a labelled pod that looks admitted
// (it carries a forged token, slot and admitted-at), and the manager's line
// then treats it as one of its admitted pods (it deletes it at its "ttl").
func TestAttackFakeMirrorPodLooksAdmitted(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	alice, _ := atkEditUser(t, ns)
	p := newGated(ns, "fake-mirror", "mirror",
		corev1.MirrorPodAnnotationKey, "forged",
		gatedpod.TokenAnnotation, "999999999", gatedpod.SlotAnnotation, "0",
		gatedpod.AdmittedAt, time.Now().UTC().Format(gatedpod.TimeFormat), gatedpod.TTLAnnotation, "2s")
	// The API requires a mirror pod to be bound; the webhook, which skips
	// mirror pods, does not refuse its nodeName.
	p.Spec.NodeName = "node-1"
	p.Spec.ServiceAccountName = "" // the ServiceAccount plugin refuses one on a mirror pod
	automount := false
	p.Spec.AutomountServiceAccountToken = &automount
	err := alice.Create(ctx, p)
	if err != nil {
		t.Logf("refused: %v", err)
		return
	}
	t.Logf("stored: gates %v, annotations %v", p.Spec.SchedulingGates, p.Annotations)
	if !gatedpod.Gated(p) && p.Annotations[gatedpod.TokenAnnotation] == "999999999" {
		fixedFinding(t, "a user-created pod with the mirror annotation is exempt from the gate webhook and the gated-pods policy, so an edit user can store a labelled pod with a forged token/slot/admitted-at that listings (docs' custom-columns) and the line take for an admitted holder; the exemption should be limited to the kubelet (request.userInfo.groups contains 'system:nodes')")
		// Does the line act on it?
		gone := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
			cur, ok := get(t, ns, "fake-mirror")
			return !ok || cur.DeletionTimestamp != nil, nil
		}) == nil
		t.Logf("the manager deleted the fake mirror pod at its forged ttl: %v", gone)
		t.Fatal("a labelled pod with a forged token was stored by an edit user")
	}
}

// With holder rights (queen-locks-holder is aggregated into edit), a
// namespace user can delete the permit of an admitted gated pod, or renew
// it with a short ttl so that it expires: the next pod of the line is then
// let in while the first still runs. docs/gated-pods.md promises "no more
// than limit gated pods of one lock are let in and not yet ended at once".
func TestAttackDeletingAGatedPodsPermitLetsTheNextIn(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	alice, _ := atkEditUser(t, ns)
	holder, waiting := atkBusy(t, ns, "perm")
	q := permitOf(t, holder)
	err := alice.Delete(ctx, q)
	t.Logf("an edit user deleting the permit of an admitted gated pod: %v", err)
	if err != nil {
		return
	}
	letIn := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		p, _ := get(t, ns, waiting.Name)
		return !gatedpod.Gated(p), nil
	}) == nil
	t.Logf("the next pod was let in while the first runs: %v; running: %v", letIn, running(t, ns))
	if letIn {
		finding(t, "deleting (or renewing with a short ttl) the permit of a running gated pod, which any holder of the namespace may do, lets the next gated pod in while the first still runs: 2 running with limit 1")
		t.Fatalf("running %v with limit 1", running(t, ns))
	}
}

func TestAttackRenewingAGatedPodsPermitShortLetsTheNextIn(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	alice, _ := atkEditUser(t, ns)
	holder, waiting := atkBusy(t, ns, "renew")
	q := permitOf(t, holder)
	// A renew: same owner, same acquireTime, a new ttl of 1 second.
	q.Spec.TTLSeconds = 1
	err := alice.Update(ctx, q)
	t.Logf("an edit user renewing a gated pod's permit with ttl 1s: %v", err)
	if err != nil {
		return
	}
	if cur, ok := get(t, ns, holder.Name); ok && cur.Annotations[gatedpod.TokenAnnotation] != q.ResourceVersion {
		t.Logf("the pod's token %s no longer matches its permit's %s: its fenced writes (section 8) now fail", cur.Annotations[gatedpod.TokenAnnotation], q.ResourceVersion)
	}
	letIn := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
		p, _ := get(t, ns, waiting.Name)
		return !gatedpod.Gated(p), nil
	}) == nil
	t.Logf("the next pod was let in while the first runs: %v; running: %v", letIn, running(t, ns))
	if letIn {
		finding(t, "renewing a running gated pod's permit (owner pod:<uid> is public in the permit) with ttlSeconds 1 changes its token and lets it expire: the next gated pod is let in while the first still runs")
		t.Fatalf("running %v with limit 1", running(t, ns))
	}
}

// A pod's limit annotation is its own: pods of one lock with different
// limits share the low slots and the larger limit rules (as the route's
// semaphores do). A pod asking "at most 1" then runs beside another: an
// edit user who wants to skip the line sets a larger limit.
func TestAttackALargerLimitSkipsTheLine(t *testing.T) {
	ns := entitledNamespace(t)
	gated(t, ns, "holder", "mixed")
	holder := admitted(t, ns, "holder")
	jumper := gated(t, ns, "jumper", "mixed", gatedpod.LimitAnnotation, "1024")
	p := admitted(t, ns, jumper.Name)
	t.Logf("a pod with limit 1024 let in at slot %s while %s (limit 1) holds slot 0: running %v",
		p.Annotations[gatedpod.SlotAnnotation], holder.Name, running(t, ns))
	// Behind a waiting pod of limit 1 it does not wait: that pod waits
	// for slot 0 alone, and a slot below 1024 is free.
	waiting := gated(t, ns, "waiting", "mixed")
	told(t, waiting, "Waiting", "number 1 in line")
	second := gated(t, ns, "second-jumper", "mixed", gatedpod.LimitAnnotation, "1024")
	admitted(t, ns, second.Name)
	if n := len(running(t, ns)); n > 1 {
		finding(t, "pods of one lock may carry different limits and the larger rules (as the route's semaphores do): a later pod with a larger limit is let in beside a running pod that asked for at most 1; nothing refuses or warns at admission, and docs/gated-pods.md does not say it (refuse a pod whose limit differs from the lock's waiting/holding gated pods, or document it)")
		t.Fatalf("%d pods of lock mixed run while the first asked for at most 1", n)
	}
}

// ---------------------------------------------------------------------
// 2. Bad annotations, at create and by update.
// ---------------------------------------------------------------------

func TestAttackBadAnnotationsAreRefusedNamingThem(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	alice, _ := atkEditUser(t, ns)
	long := strings.Repeat("x", 257)
	wide := strings.Repeat("é", 129) // 258 bytes, 129 characters
	for _, c := range []struct {
		name, key, value, cause string
	}{
		{"empty lock", gatedpod.LockAnnotation, "", "must not be empty"},
		{"long lock", gatedpod.LockAnnotation, long, "at most 256 bytes"},
		{"long in bytes", gatedpod.LockAnnotation, wide, "at most 256 bytes"},
		{"newline", gatedpod.LockAnnotation, "a\nb", "control character"},
		{"nul", gatedpod.LockAnnotation, "a\x00b", "control character"},
		{"del", gatedpod.LockAnnotation, "a\x7fb", "control character"},
		{"c1 control", gatedpod.LockAnnotation, "a\u0085b", "control character"},
		{"hash", gatedpod.LockAnnotation, "a#0", "'#'"},
		{"limit 0", gatedpod.LimitAnnotation, "0", "must be from 1 to 1024"},
		{"limit -1", gatedpod.LimitAnnotation, "-1", "must be from 1 to 1024"},
		{"limit 1025", gatedpod.LimitAnnotation, "1025", "must be from 1 to 1024"},
		{"limit 1e3", gatedpod.LimitAnnotation, "1e3", "is not a whole number"},
		{"limit space", gatedpod.LimitAnnotation, " 2", "is not a whole number"},
		{"limit trailing space", gatedpod.LimitAnnotation, "2 ", "is not a whole number"},
		{"limit empty", gatedpod.LimitAnnotation, "", "is not a whole number"},
		{"limit hex", gatedpod.LimitAnnotation, "0x10", "is not a whole number"},
		{"limit fraction", gatedpod.LimitAnnotation, "1.0", "is not a whole number"},
		{"limit huge", gatedpod.LimitAnnotation, "99999999999999999999999", "is not a whole number"},
		{"limit int64 max", gatedpod.LimitAnnotation, "9223372036854775807", "must be from 1 to 1024"},
		{"limit arabic digit", gatedpod.LimitAnnotation, "٢", "is not a whole number"},
		{"ttl 0s", gatedpod.TTLAnnotation, "0s", "must be whole seconds from 1s"},
		{"ttl -1s", gatedpod.TTLAnnotation, "-1s", "must be whole seconds from 1s"},
		{"ttl 1y", gatedpod.TTLAnnotation, "1y", "is not a duration"},
		{"ttl bare number", gatedpod.TTLAnnotation, "30", "is not a duration"},
		{"ttl empty", gatedpod.TTLAnnotation, "", "is not a duration"},
		{"ttl fraction", gatedpod.TTLAnnotation, "1.5s", "must be whole seconds"},
		{"ttl past a year", gatedpod.TTLAnnotation, "8761h", "must be whole seconds from 1s to"},
		{"ttl huge", gatedpod.TTLAnnotation, "9999999999999h", "is not a duration"},
		{"ttl int64 ns", gatedpod.TTLAnnotation, "9223372036854775807ns", "must be whole seconds"},
		{"ttl control", gatedpod.TTLAnnotation, "1h\x01", "is not a duration"},
		{"ttl misspelt", "locks.queen.dev/tll", "30s", "is not one queen-locks reads"},
		{"limit misspelt", "locks.queen.dev/limits", "2", "is not one queen-locks reads"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newGated(ns, "bad", "nightly")
			p.Annotations[c.key] = c.value
			err := alice.Create(ctx, p)
			if err == nil {
				_ = env.Client.Delete(ctx, p)
				t.Fatalf("%s=%q was admitted", c.key, c.value)
			}
			if !strings.Contains(err.Error(), "annotation "+c.key) || !strings.Contains(err.Error(), c.cause) {
				t.Fatalf("%s=%q: got %v, want a refusal naming the annotation and %q", c.key, c.value, err, c.cause)
			}
			if strings.ContainsAny(err.Error(), "\x00\x01\x7f") {
				t.Fatalf("the refusal carries raw control characters: %q", err.Error())
			}
		})
	}
	var list corev1.PodList
	if err := env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil || len(list.Items) != 0 {
		t.Fatalf("refused pods were stored: %d, %v", len(list.Items), err)
	}

	// Good values at the edges are admitted.
	for i, ann := range []map[string]string{
		{gatedpod.LockAnnotation: strings.Repeat("x", 256)},
		{gatedpod.LockAnnotation: strings.Repeat("é", 128)},
		{gatedpod.LockAnnotation: "データ/レポート 1"},
		{gatedpod.LockAnnotation: "zero\u200bwidth"},
		{gatedpod.LockAnnotation: "l", gatedpod.LimitAnnotation: "1024"},
		{gatedpod.LockAnnotation: "l", gatedpod.LimitAnnotation: "+2"},
		{gatedpod.LockAnnotation: "l", gatedpod.LimitAnnotation: "002"},
		{gatedpod.LockAnnotation: "l", gatedpod.TTLAnnotation: "2h30m"},
		{gatedpod.LockAnnotation: "l", gatedpod.TTLAnnotation: "1s"},
		{gatedpod.LockAnnotation: "l", gatedpod.TTLAnnotation: "8760h"},
		{gatedpod.LockAnnotation: "l", gatedpod.TTLAnnotation: ".5h"},
	} {
		p := newGated(ns, fmt.Sprintf("good-%d", i), "x")
		p.Annotations = ann
		if err := alice.Create(ctx, p); err != nil {
			t.Errorf("good annotations %q refused: %v", ann, err)
		}
	}
}

// The same annotations by update after create: every change of a
// locks.queen.dev/ annotation is refused, valid or not, and nothing is
// applied. The refusal names the prefix, not the annotation, nor why the
// value would be wrong.
func TestAttackBadAnnotationsByUpdateAreRefused(t *testing.T) {
	ns := entitledNamespace(t)
	alice, _ := atkEditUser(t, ns)
	p := gated(t, ns, "valid", "upd", gatedpod.TTLAnnotation, "1h")
	before := admitted(t, ns, "valid")
	for _, c := range []struct{ key, value string }{
		{gatedpod.LockAnnotation, ""}, {gatedpod.LockAnnotation, "a\nb"}, {gatedpod.LockAnnotation, "other"},
		{gatedpod.LimitAnnotation, "0"}, {gatedpod.LimitAnnotation, "1e3"}, {gatedpod.LimitAnnotation, "2"},
		{gatedpod.TTLAnnotation, "0s"}, {gatedpod.TTLAnnotation, "1y"}, {gatedpod.TTLAnnotation, "2h30m"},
		{"locks.queen.dev/anything", "x"},
	} {
		raw, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{c.key: c.value}}})
		err := atkRefusal(t, c.key+"="+strconv.Quote(c.value), func() error { return atkMerge(t, alice, p, string(raw)) },
			"the locks.queen.dev/ annotations of a gated pod are set at create and then by the queen-locks manager alone")
		if err != nil && strings.Contains(err.Error(), c.key) {
			t.Logf("the refusal names %s", c.key)
		}
	}
	// Removing one is refused too.
	atkRefused(t, "remove the ttl", func() error {
		return atkMerge(t, alice, p, `{"metadata":{"annotations":{"locks.queen.dev/ttl":null}}}`)
	}, "the locks.queen.dev/ annotations of a gated pod are set at create")
	after, _ := get(t, ns, "valid")
	for k, v := range before.Annotations {
		if strings.HasPrefix(k, "locks.queen.dev/") && after.Annotations[k] != v {
			t.Fatalf("annotation %s changed from %q to %q", k, v, after.Annotations[k])
		}
	}
}

// ---------------------------------------------------------------------
// 1b. Subresources the policy does not cover.
// ---------------------------------------------------------------------

// The policies match the pods resource only, not pods/status: whoever may
// write a pod's status (kubelets, controllers, administrators) can change
// the label and the locks.queen.dev/ annotations there, which only the
// manager may change once the pod is created (the line writes them).
func TestAttackStatusSubresourceChangesTheLockAnnotations(t *testing.T) {
	ns := entitledNamespace(t)
	holder, waiting := atkBusy(t, ns, "status")
	// As a node would (a kubelet may write its pods' status), and as the
	// administrator.
	err := atkMergeSub(t, env.Client, holder, "status", `{"metadata":{"annotations":{"locks.queen.dev/token":"1","locks.queen.dev/lock":"elsewhere"}}}`)
	t.Logf("the administrator changing an admitted pod's token and lock through pods/status: %v", err)
	err2 := atkMergeSub(t, env.Client, waiting, "status", `{"metadata":{"labels":{"locks.queen.dev/gate":null}}}`)
	t.Logf("the administrator removing a waiting pod's label through pods/status: %v", err2)
	cur, _ := get(t, ns, holder.Name)
	w, _ := get(t, ns, waiting.Name)
	changed := cur.Annotations[gatedpod.TokenAnnotation] == "1" || cur.Annotations[gatedpod.LockAnnotation] == "elsewhere" || !gatedpod.Labelled(w)
	t.Logf("after: holder token %q lock %q; waiting labelled %v", cur.Annotations[gatedpod.TokenAnnotation], cur.Annotations[gatedpod.LockAnnotation], gatedpod.Labelled(w))
	if changed {
		fixedFinding(t, "the gated-pods policies match resources [pods] only: an update through pods/status changes the label and the locks.queen.dev/ annotations (token, lock) unchecked; add pods/status to the policy's resourceRules")
		t.Fatal("pods/status changed what only the manager may change")
	}
}

// A binding (the scheduler's pods/binding) copies its annotations onto the
// pod: whoever may bind pods can set locks.queen.dev/ annotations of an
// admitted, not yet bound pod.
func TestAttackBindingSetsLockAnnotations(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	gated(t, ns, "tobind", "bind")
	p := admitted(t, ns, "tobind")
	b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p.Name,
		Annotations: map[string]string{gatedpod.TokenAnnotation: "1"}},
		Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"}}
	err := env.Client.SubResource("binding").Create(ctx, p, b)
	t.Logf("binding an admitted pod with a token annotation: %v", err)
	cur, _ := get(t, ns, p.Name)
	t.Logf("after: node %q token %q", cur.Spec.NodeName, cur.Annotations[gatedpod.TokenAnnotation])
	if cur.Annotations[gatedpod.TokenAnnotation] == "1" {
		finding(t, "pods/binding copies the binding's annotations onto the pod and is not matched by the gated-pods policy: a binder (scheduler or anyone with pods/binding) can rewrite locks.queen.dev/token")
		t.Fatal("a binding changed the pod's token")
	}
}

// ---------------------------------------------------------------------
// 4. The manager's identity, if its token were stolen.
// ---------------------------------------------------------------------

func TestAttackTheManagersIdentityOnPods(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	mgr := atkManager(t)

	// A waiting pod with an init container, an affinity, volumes and env.
	base := newGated(ns, "victim", "victim")
	base.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "init"}}
	base.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "A", Value: "a"}}
	base.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a", "b"}}}}}}}}
	holder, _ := atkBusy(t, ns, "victim")
	base.Name = "victim"
	if err := env.Client.Create(ctx, base); err != nil {
		t.Fatal(err)
	}
	told(t, base, "Waiting", "number 2 in line")

	t.Run("refused", func(t *testing.T) {
		for _, c := range []struct{ what, patch, want string }{
			{"container image", `{"spec":{"containers":[{"name":"job","image":"evil"}]}}`, "may not change a pod's images"},
			{"env", `{"spec":{"containers":[{"name":"job","image":"job","env":[{"name":"A","value":"evil"}]}]}}`, "Forbidden"},
			{"command", `{"spec":{"containers":[{"name":"job","image":"job","command":["sh","-c","evil"]}]}}`, "Forbidden"},
			{"volume", `{"spec":{"volumes":[{"name":"host","hostPath":{"path":"/"}}]}}`, "Forbidden"},
			{"serviceAccountName", `{"spec":{"serviceAccountName":"default"}}`, "Forbidden"},
			{"nodeSelector", `{"spec":{"nodeSelector":{"evil":"node"}}}`, "may not change a pod's images, node selector"},
			{"labels", `{"metadata":{"labels":{"app":"evil"}}}`, "may change only the locks.queen.dev/ annotations"},
			{"other annotations", `{"metadata":{"annotations":{"evil":"1"}}}`, "may change only the locks.queen.dev/ annotations"},
		} {
			atkRefused(t, c.what, func() error {
				return mgr.Patch(ctx, base.DeepCopy(), client.RawPatch(types.StrategicMergePatchType, []byte(c.patch)))
			}, c.want)
		}
		atkRefused(t, "add a toleration", func() error {
			return mgr.Patch(ctx, base.DeepCopy(), client.RawPatch(types.JSONPatchType, []byte(`[{"op":"add","path":"/spec/tolerations/-","value":{"operator":"Exists"}}]`)))
		}, "may not change a pod's images, node selector, affinity or tolerations")
		// No verbs beyond patch and delete.
		p, _ := get(t, ns, "victim")
		if err := mgr.Update(ctx, p); !apierrors.IsForbidden(err) {
			t.Errorf("the manager updated (PUT) a pod: %v", err)
		}
		np := newGated(ns, "by-manager", "victim")
		if err := mgr.Create(ctx, np); !apierrors.IsForbidden(err) {
			t.Errorf("the manager created a pod: %v", err)
		}
		for _, sub := range []string{"status", "ephemeralcontainers", "resize"} {
			if err := atkMergeSub(t, mgr, base, sub, `{"metadata":{"annotations":{"x":"y"}}}`); !apierrors.IsForbidden(err) && !apierrors.IsNotFound(err) {
				t.Errorf("the manager patched pods/%s: %v", sub, err)
			}
		}
		plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"},
			Spec: corev1.PodSpec{InitContainers: []corev1.Container{{Name: "init", Image: "init"}}, Containers: []corev1.Container{{Name: "c", Image: "c"}}}}
		if err := env.Client.Create(ctx, plain); err != nil {
			t.Fatal(err)
		}
		atkRefused(t, "an unlabelled pod's init image", func() error {
			return atkMerge(t, mgr, plain, `{"spec":{"initContainers":[{"name":"init","image":"evil"}]}}`)
		}, "may change or delete only pods labelled")
		// The second policy keeps the manager from adding the label, which
		// would put a pod under its rights.
		atkRefused(t, "label an unlabelled pod", func() error {
			return atkMerge(t, mgr, plain, `{"metadata":{"labels":{"locks.queen.dev/gate":"true"}}}`)
		}, "may change or delete only pods labelled")
		// Removing another scheduling gate.
		og := newGated(ns, "othergate", "victim")
		og.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/other"}}
		if err := env.Client.Create(ctx, og); err != nil {
			t.Fatal(err)
		}
		atkRefused(t, "remove another gate", func() error {
			return atkMerge(t, mgr, og, `{"spec":{"schedulingGates":[{"name":"locks.queen.dev/lock"}]}}`)
		}, "may only remove the scheduling gate locks.queen.dev/lock")
		atkRefused(t, "remove all gates", func() error {
			return atkMerge(t, mgr, og, `{"spec":{"schedulingGates":null}}`)
		}, "may only remove the scheduling gate locks.queen.dev/lock")
	})

	t.Run("init container image", func(t *testing.T) {
		err := atkMerge(t, mgr, base, `{"spec":{"initContainers":[{"name":"init","image":"evil"}]}}`)
		cur, _ := get(t, ns, "victim")
		t.Logf("the manager changing a gated pod's init container image: %v; now %q", err, cur.Spec.InitContainers[0].Image)
		if err == nil && cur.Spec.InitContainers[0].Image == "evil" {
			fixedFinding(t, "the manager policy compares spec.containers images only: with the manager's token one can replace the image of any labelled pod's init containers (the API allows image updates), so an attacker's image runs first in every gated pod, with that pod's ServiceAccount and volumes; compare initContainers (and ephemeralContainers) images too")
			t.Fatal("the manager's identity changed an init container's image")
		}
	})

	t.Run("affinity", func(t *testing.T) {
		// The API lets a gated pod's required node affinity be narrowed.
		patch := `{"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"zone","operator":"In","values":["a","b"]},{"key":"attacker-node","operator":"Exists"}]}]}}}}}`
		err := atkMerge(t, mgr, base, patch)
		cur, _ := get(t, ns, "victim")
		t.Logf("the manager narrowing a gated pod's node affinity: %v; now %v", err, cur.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms)
		if err == nil {
			fixedFinding(t, "the manager policy checks only that spec.affinity is present or absent, not its content: the manager's identity can rewrite (narrow) a gated pod's node affinity and steer where it runs; compare the whole affinity")
			t.Fatal("the manager's identity changed a pod's affinity")
		}
	})

	t.Run("finalizers and owners", func(t *testing.T) {
		err := atkMerge(t, mgr, holder, `{"metadata":{"finalizers":["evil.example.com/keep"]}}`)
		t.Logf("the manager adding a finalizer to a labelled pod: %v", err)
		err2 := atkMerge(t, mgr, holder, fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"gone","uid":"%s"}]}}`, "00000000-0000-0000-0000-000000000000"))
		t.Logf("the manager setting ownerReferences on a labelled pod: %v", err2)
		cur, _ := get(t, ns, holder.Name)
		if len(cur.Finalizers) > 0 {
			// Let the test's namespace go.
			_ = atkMerge(t, env.Client, cur, `{"metadata":{"finalizers":null}}`)
		}
		if err == nil || err2 == nil {
			fixedFinding(t, "the manager policy compares labels and non-locks annotations, not finalizers or ownerReferences: the manager's identity can add a finalizer (a labelled pod that never goes away) or an ownerReference (the garbage collector then deletes the pod) to any labelled pod")
			t.Fatal("the manager's identity changed a labelled pod's finalizers or owners")
		}
	})

	t.Run("delete a labelled pod anywhere", func(t *testing.T) {
		// By design (the manager may delete labelled pods: it deletes a
		// gated pod still running past its ttl), including in
		// the namespaces the webhook skips: documented here.
		p := newGated("kube-system", "labelled-system-pod", "x")
		p.Spec.ServiceAccountName = ""
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		t.Logf("a labelled pod of kube-system, which the webhook skips, is stored with gates %v", p.Spec.SchedulingGates)
		err := mgr.Delete(ctx, p)
		t.Logf("the manager deleting a labelled pod of kube-system: %v", err)
		_ = env.Client.Delete(ctx, p)
	})
}

// ---------------------------------------------------------------------
// 3. Races and the line.
// ---------------------------------------------------------------------

// atkWatch records the pods and permits of a namespace in the order the
// API server wrote them.
type atkWatch struct {
	mu sync.Mutex
	// pods: the last version of each pod, by name.
	pods map[string]*corev1.Pod
	// queued: queued-at of each pod ever seen, by name.
	queued map[string]time.Time
	uid    map[string]types.UID
	lockOf map[string]string
	// admittedOrder per lock: names in the order they were let in.
	admittedOrder map[string][]string
	tokens        map[string][]string
	maxHeld       map[string]int
	heldNow       map[string][]string
	overLimit     []string
	outOfOrder    []string
	// permits
	permits     map[string]*locksv1alpha1.QueenLock // by name
	versions    map[string]locksv1alpha1.QueenLock  // every version seen, by resourceVersion
	maxPermits  map[string]int
	limitOf     map[string]int
	deletedPods map[string]bool
}

func newAtkWatch() *atkWatch {
	return &atkWatch{pods: map[string]*corev1.Pod{}, queued: map[string]time.Time{}, uid: map[string]types.UID{},
		lockOf: map[string]string{}, admittedOrder: map[string][]string{}, tokens: map[string][]string{},
		maxHeld: map[string]int{}, heldNow: map[string][]string{}, permits: map[string]*locksv1alpha1.QueenLock{},
		versions: map[string]locksv1alpha1.QueenLock{}, maxPermits: map[string]int{}, limitOf: map[string]int{},
		deletedPods: map[string]bool{}}
}

func (h *atkWatch) pod(p *corev1.Pod, deleted bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !gatedpod.Labelled(p) {
		return
	}
	lock := p.Annotations[gatedpod.LockAnnotation]
	h.lockOf[p.Name] = lock
	h.uid[p.Name] = p.UID
	if t, err := time.Parse(gatedpod.TimeFormat, p.Annotations[gatedpod.QueuedAt]); err == nil {
		h.queued[p.Name] = t
	}
	prev := h.pods[p.Name]
	if tok := p.Annotations[gatedpod.TokenAnnotation]; tok != "" {
		ts := h.tokens[p.Name]
		if len(ts) == 0 || ts[len(ts)-1] != tok {
			h.tokens[p.Name] = append(ts, tok)
		}
	}
	if !deleted && !gatedpod.Gated(p) && (prev == nil || gatedpod.Gated(prev)) {
		// Let in now: it must be the first in line of its lock among the
		// pods still waiting with nothing but our gate.
		for name, q := range h.pods {
			if name == p.Name || h.lockOf[name] != lock || !gatedpod.OnlyOurGate(q) || q.DeletionTimestamp != nil {
				continue
			}
			if h.queued[name].Before(h.queued[p.Name]) {
				h.outOfOrder = append(h.outOfOrder, fmt.Sprintf("%s let in before %s, queued earlier", p.Name, name))
			}
		}
		h.admittedOrder[lock] = append(h.admittedOrder[lock], p.Name)
	}
	if deleted {
		delete(h.pods, p.Name)
		h.deletedPods[p.Name] = true
	} else {
		h.pods[p.Name] = p
	}
	var held []string
	for name, q := range h.pods {
		if h.lockOf[name] == lock && !gatedpod.Gated(q) && !gatedpod.Finished(q) {
			held = append(held, name)
		}
	}
	sort.Strings(held)
	h.heldNow[lock] = held
	if len(held) > h.maxHeld[lock] {
		h.maxHeld[lock] = len(held)
	}
	if l := h.limitOf[lock]; l > 0 && len(held) > l {
		h.overLimit = append(h.overLimit, fmt.Sprintf("lock %s: %v let in and unfinished at once (limit %d)", lock, held, l))
	}
}

func (h *atkWatch) permit(q *locksv1alpha1.QueenLock, deleted bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if deleted {
		delete(h.permits, q.Name)
	} else {
		h.permits[q.Name] = q
		h.versions[q.ResourceVersion] = *q
	}
	n := 0
	for _, p := range h.permits {
		if p.Spec.Lock == q.Spec.Lock {
			n++
		}
	}
	if n > h.maxPermits[q.Spec.Lock] {
		h.maxPermits[q.Spec.Lock] = n
	}
}

// start watches ns's pods and permits until the test ends; stop waits for
// the watches to drain.
func (h *atkWatch) start(t *testing.T, ns string) (stop func()) {
	t.Helper()
	ctx := context.Background()
	pw, err := env.Clientset.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: manager.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	qw, err := wc.Watch(ctx, &locksv1alpha1.QueenLockList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for ev := range pw.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok {
				h.pod(p, ev.Type == watch.Deleted)
			}
		}
	}()
	go func() {
		defer wg.Done()
		for ev := range qw.ResultChan() {
			if q, ok := ev.Object.(*locksv1alpha1.QueenLock); ok {
				h.permit(q, ev.Type == watch.Deleted)
			}
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			// Let the watches catch up with the last writes.
			time.Sleep(2 * time.Second)
			pw.Stop()
			qw.Stop()
			wg.Wait()
		})
	}
	t.Cleanup(stop)
	return stop
}

// check is what must hold of the whole history.
func (h *atkWatch) check(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.overLimit {
		t.Errorf("over the limit: %s", s)
	}
	for _, s := range h.outOfOrder {
		t.Errorf("out of order: %s", s)
	}
	for lock, n := range h.maxPermits {
		if l := h.limitOf[lock]; l > 0 && n > l {
			t.Errorf("lock %s had %d permits at once, limit %d", lock, n, l)
		}
	}
	for name, ts := range h.tokens {
		if len(ts) != 1 {
			t.Errorf("pod %s carried tokens %v, want one", name, ts)
			continue
		}
		v, ok := h.versions[ts[0]]
		switch {
		case !ok:
			t.Errorf("pod %s carries token %s, which no version of a permit had", name, ts[0])
		case v.Spec.Owner != "pod:"+string(h.uid[name]) || v.Spec.HolderPod == nil || v.Spec.HolderPod.UID != string(h.uid[name]) || v.Spec.Lock != h.lockOf[name]:
			t.Errorf("pod %s carries token %s, a permit of %s held by %s (pod %+v)", name, ts[0], v.Spec.Lock, v.Spec.Owner, v.Spec.HolderPod)
		}
	}
}

// Thirty gated pods of one semaphore of 3, and ten of a lock in the same
// namespace, created at once behind busy slots; some deleted while they
// wait, every admitted one finished or deleted as soon as it is let in.
func TestAttackRaceManyPodsTwoLocks(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	h := newAtkWatch()
	h.limitOf["race"], h.limitOf["solo"] = 3, 1
	stop := h.start(t, ns)

	// Hold every slot, so the line opens only once all pods are in it.
	l := locks.New(env.Client, nil)
	var blockers []locks.Acquired
	for i := range 3 {
		got, err := l.Acquire(ctx, ns, "race", fmt.Sprintf("blocker-%d", i), 600, 3)
		if err != nil || !got.Acquired {
			t.Fatal(got, err)
		}
		blockers = append(blockers, got)
	}
	solo, err := l.Acquire(ctx, ns, "solo", "blocker-solo", 600, 1)
	if err != nil || !solo.Acquired {
		t.Fatal(solo, err)
	}

	const n, m = 30, 10
	var wg sync.WaitGroup
	errs := make(chan error, n+m)
	for i := range n + m {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lock, extra := "race", []string{gatedpod.LimitAnnotation, "3"}
			if i >= n {
				lock, extra = "solo", nil
			}
			p := newGated(ns, fmt.Sprintf("%s-%02d", lock, i), lock, extra...)
			if err := env.Client.Create(ctx, p); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Every pod is in the line before the slots free.
	var last *corev1.Pod
	for _, lock := range []string{"race", "solo"} {
		var list corev1.PodList
		if err := env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var pods []*corev1.Pod
		for i := range list.Items {
			if list.Items[i].Annotations[gatedpod.LockAnnotation] == lock {
				pods = append(pods, &list.Items[i])
			}
		}
		sort.Slice(pods, func(i, j int) bool {
			return pods[i].Annotations[gatedpod.QueuedAt] < pods[j].Annotations[gatedpod.QueuedAt] ||
				(pods[i].Annotations[gatedpod.QueuedAt] == pods[j].Annotations[gatedpod.QueuedAt] && pods[i].UID < pods[j].UID)
		})
		last = pods[len(pods)-1]
		told(t, last, "Waiting", fmt.Sprintf("number %d in line", len(pods)))
		if lock == "race" {
			// Delete three pods while they wait: one at the head, two in
			// the middle.
			for _, i := range []int{0, 12, 20} {
				remove(t, pods[i])
			}
		}
	}

	// Open the line, and end each pod as soon as it is let in: most
	// finish, every fourth is deleted instead, one is deleted before its
	// turn while the line runs.
	for _, b := range blockers {
		if ok, err := l.Release(ctx, ns, "race", b.Slot, b.Token, b.Owner); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	if ok, err := l.Release(ctx, ns, "solo", solo.Slot, solo.Token, solo.Owner); err != nil || !ok {
		t.Fatal(ok, err)
	}
	ended := map[string]bool{}
	seen := map[string]time.Time{}
	k := 0
	lateDeleted := false
	err = wait.PollUntilContextTimeout(ctx, 30*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		var list corev1.PodList
		if err := env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false, err
		}
		left := 0
		held := map[string]int{}
		for i := range list.Items {
			p := &list.Items[i]
			if gatedpod.Labelled(p) && !gatedpod.Gated(p) && !gatedpod.Finished(p) && !ended[p.Name] {
				held[p.Annotations[gatedpod.LockAnnotation]]++
			}
		}
		for i := range list.Items {
			p := &list.Items[i]
			if !gatedpod.Labelled(p) || gatedpod.Finished(p) {
				continue
			}
			left++
			if gatedpod.Gated(p) {
				if !lateDeleted && p.Annotations[gatedpod.LockAnnotation] == "race" && len(ended) > 5 {
					// Only the waiting version read here: a pod let in
					// meanwhile is not deleted, and another is tried.
					rv := p.ResourceVersion
					lateDeleted = env.Client.Delete(ctx, p, client.Preconditions{ResourceVersion: &rv}) == nil
				}
				continue
			}
			if ended[p.Name] {
				continue
			}
			lock := p.Annotations[gatedpod.LockAnnotation]
			if _, ok := seen[p.Name]; !ok {
				seen[p.Name] = time.Now()
			}
			// Half end as soon as they are let in; the others run until
			// their lock is full, or for a second, so that the limit is
			// reached and tested.
			if len(seen)%2 == 0 && held[lock] < h.limitOf[lock] && time.Since(seen[p.Name]) < time.Second {
				continue
			}
			ended[p.Name] = true
			held[lock]--
			k++
			if k%4 == 0 {
				_ = env.Client.Delete(ctx, p)
				continue
			}
			p.Status.Phase = corev1.PodSucceeded
			if k%7 == 0 {
				p.Status.Phase = corev1.PodFailed
			}
			err := env.Client.Status().Update(ctx, p)
			switch {
			case apierrors.IsConflict(err):
				delete(ended, p.Name)
				held[lock]++
				k--
			case err != nil && !apierrors.IsNotFound(err):
				return false, err
			}
		}
		return left == 0, nil
	})
	if err != nil {
		h.mu.Lock()
		t.Logf("let in so far: %v; held now: %v", h.admittedOrder, h.heldNow)
		h.mu.Unlock()
		t.Fatalf("the lines did not drain: %v", err)
	}
	// Every permit of both locks is freed.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return len(heldBy(t, ns, "race", ""))+len(heldBy(t, ns, "solo", "")) == 0, nil
	})
	if err != nil {
		t.Errorf("permits left after every pod ended: %v %v", heldBy(t, ns, "race", ""), heldBy(t, ns, "solo", ""))
	}
	stop()
	h.check(t)
	h.mu.Lock()
	defer h.mu.Unlock()
	t.Logf("most let in at once: %v; order: %v", h.maxHeld, h.admittedOrder)
	if len(h.admittedOrder["race"]) != n-4 || len(h.admittedOrder["solo"]) != m {
		t.Errorf("let in %d of race (want %d) and %d of solo (want %d)", len(h.admittedOrder["race"]), n-4, len(h.admittedOrder["solo"]), m)
	}
	// How many Waiting events the lines wrote.
	var evs eventsv1.EventList
	if err := env.Client.List(ctx, &evs, client.InNamespace(ns)); err == nil {
		count := map[string]int32{}
		for _, e := range evs.Items {
			c := e.DeprecatedCount
			if c == 0 {
				c = 1
			}
			count[e.Reason] += c
		}
		t.Logf("events by reason: %v (%d objects)", count, len(evs.Items))
	}
}

// A pod at the back of a long line is told its place at every change; the
// core event recorder drops a pod's events past a burst of 25 (one more
// per 5 minutes), so a pod that moves more than ~24 places is left with a
// stale place, and its Admitted event (token and slot) is dropped too.
func TestAttackLongLineLeavesStalePlaces(t *testing.T) {
	// Slow (it waits to show that nothing happens): skipped up front.
	fixedFinding(t, "a waiting pod is sent one event per place it moves (O(n^2) events for a line of n); client-go's correlator combines a pod's events past 10 and its spam filter keeps 25 per pod (then one per 5 minutes), so in a long line the back pods' later places and their Admitted event (token and slot) are dropped while the line believes it told them; tell places less often (e.g. only when the place is small or halves) and never let Admitted share the Waiting budget")
	ctx := context.Background()
	ns := entitledNamespace(t)
	l := locks.New(env.Client, nil)
	blocker, err := l.Acquire(ctx, ns, "long", "blocker", 600, 1)
	if err != nil || !blocker.Acquired {
		t.Fatal(blocker, err)
	}
	const n = 32
	var pods []*corev1.Pod
	for i := range n {
		pods = append(pods, gated(t, ns, fmt.Sprintf("long-%02d", i), "long"))
	}
	lastPod := pods[n-1]
	told(t, lastPod, "Waiting", fmt.Sprintf("number %d in line", n))
	if ok, err := l.Release(ctx, ns, "long", blocker.Slot, blocker.Token, blocker.Owner); err != nil || !ok {
		t.Fatal(ok, err)
	}
	for i := range n - 1 {
		p := admitted(t, ns, pods[i].Name)
		finish(t, p)
	}
	admitted(t, ns, lastPod.Name)
	// What was the last pod told? Events are written in the background:
	// give them time.
	var notes []string
	var admittedTold, okOne bool
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var evs eventsv1.EventList
		if err := env.Client.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return false, err
		}
		notes, admittedTold, okOne = nil, false, false
		for _, e := range evs.Items {
			if e.Regarding.UID != lastPod.UID {
				continue
			}
			notes = append(notes, fmt.Sprintf("%s x%d: %s", e.Reason, max(e.DeprecatedCount, 1), e.Note))
			admittedTold = admittedTold || e.Reason == "Admitted"
			okOne = okOne || strings.Contains(e.Note, "number 1 in line")
		}
		return admittedTold && okOne, nil
	})
	t.Logf("the last pod's events: %q", notes)
	if !admittedTold || !okOne {
		t.Fatalf("the last pod of a line of %d was never told it was number 1 (%v) or that it was admitted (%v)", n, okOne, admittedTold)
	}
}

// A pod whose ServiceAccount loses its rights while it waits is told
// NotEntitled and stays gated; once the rights are back it should go on.
// Nothing wakes the line when a RoleBinding changes: the pod waits until
// some other pod or permit of its lock changes.
func TestAttackNotEntitledThenEntitledAgain(t *testing.T) {
	// Slow (it waits to show that nothing happens): skipped up front.
	fixedFinding(t, "a pod told NotEntitled is never tried again when its rights come back: the line is woken only by its lock's pods and permits (no requeue for NotEntitled), so it waits until some other event of that lock, up to the cache's resync period (10 h); requeue NotEntitled pods with a backoff")
	ctx := context.Background()
	ns := entitledNamespace(t)
	holder, waiting := atkBusy(t, ns, "rights")
	var rb rbacv1.RoleBinding
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "holder"}, &rb); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, &rb); err != nil {
		t.Fatal(err)
	}
	// Let RBAC's informer see it, then free the lock.
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		missing, err := gatedpod.Entitled(ctx, env.Clientset, ns, "job")
		return missing != "", err
	}); err != nil {
		t.Fatal(err)
	}
	finish(t, holder)
	told(t, waiting, "NotEntitled", `may no longer create queenlocks`)
	atkStays(t, ns, waiting.Name, time.Second)

	rb.ResourceVersion = ""
	if err := env.Client.Create(ctx, &rb); err != nil {
		t.Fatal(err)
	}
	letIn := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		p, _ := get(t, ns, waiting.Name)
		return !gatedpod.Gated(p), nil
	}) == nil
	if !letIn {
		t.Fatal("the pod stayed gated 30s after its ServiceAccount may hold locks again")
	}
}

// A pod that waits for the namespace's ResourceQuota (no room for a new
// permit) is not woken when room appears: a permit of another lock freed,
// or the quota raised.
func TestAttackQuotaRoomDoesNotWakeTheLine(t *testing.T) {
	// Slow (it waits to show that nothing happens): skipped up front.
	fixedFinding(t, "a gated pod that waits because the namespace's ResourceQuota has no room is woken only by its own lock's permits and pods: room made by another lock's release or a raised quota is never noticed (until an unrelated event or the resync); requeue quota waits with a backoff")
	ctx := context.Background()
	ns := entitledNamespace(t)
	q := env.SetQuota(t, ns, 1)
	l := locks.New(env.Client, nil)
	other, err := l.Acquire(ctx, ns, "other", "someone", 600, 1)
	if err != nil || !other.Acquired {
		t.Fatal(other, err)
	}
	p := gated(t, ns, "quota", "q")
	told(t, p, "Waiting", "ResourceQuota has no room")
	// Room appears: the quota is raised.
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(q), q); err != nil {
		t.Fatal(err)
	}
	q.Spec.Hard[controlplane.QuotaResource] = *resource.NewQuantity(5, resource.DecimalSI)
	if err := env.Client.Update(ctx, q); err != nil {
		t.Fatal(err)
	}
	q.Status.Hard = q.Spec.Hard
	if err := env.Client.Status().Update(ctx, q); err != nil {
		t.Fatal(err)
	}
	letIn := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		cur, _ := get(t, ns, p.Name)
		return !gatedpod.Gated(cur), nil
	}) == nil
	if !letIn {
		t.Fatal("the pod stayed gated 30s after the quota had room")
	}
}

// A pod with a scheduling gate of its own waits for it first, is told so,
// and joins the line once that gate is removed (by its owner, which the
// policy allows).
func TestAttackAnotherGateOfItsOwn(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	alice, _ := atkEditUser(t, ns)
	p := newGated(ns, "two-gates", "og")
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/quota"}}
	if err := alice.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	if len(p.Spec.SchedulingGates) != 2 {
		t.Fatalf("gates %v", p.Spec.SchedulingGates)
	}
	told(t, p, "OtherGates", "waits for its other scheduling gates")
	// The lock is free but nothing is taken for it.
	if h := heldBy(t, ns, "og", ""); len(h) != 0 {
		t.Fatalf("a permit was taken for a pod with another gate: %v", h)
	}
	// A later pod of the same lock is not held up by it.
	gated(t, ns, "later", "og")
	later := admitted(t, ns, "later")
	// Its owner lifts its own gate; ours stays.
	atkRefused(t, "lift both gates", func() error {
		return atkMerge(t, alice, p, `{"spec":{"schedulingGates":null}}`)
	}, "only the queen-locks manager removes the scheduling gate")
	if err := atkMerge(t, alice, p, `{"spec":{"schedulingGates":[{"name":"locks.queen.dev/lock"}]}}`); err != nil {
		t.Fatalf("removing its own gate: %v", err)
	}
	told(t, p, "Waiting", "number 1 in line")
	finish(t, later)
	got := admitted(t, ns, "two-gates")
	permitOf(t, got)
}

// A gated pod that is being deleted (a finalizer holds it) leaves the
// line; the line goes on behind it.
func TestAttackTerminatingWaitingPodLeavesTheLine(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	holder, waiting := atkBusy(t, ns, "term")
	behind := gated(t, ns, "behind", "term")
	told(t, behind, "Waiting", "number 2 in line")
	if err := atkMerge(t, env.Client, waiting, `{"metadata":{"finalizers":["example.com/keep"]}}`); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, waiting); err != nil {
		t.Fatal(err)
	}
	finish(t, holder)
	admitted(t, ns, "behind")
	if h := heldBy(t, ns, "term", "pod:"+string(waiting.UID)); len(h) != 0 {
		t.Fatalf("a terminating pod holds %v", h)
	}
	cur, _ := get(t, ns, waiting.Name)
	if !gatedpod.Gated(cur) {
		t.Fatal("a terminating pod was let in")
	}
	_ = atkMerge(t, env.Client, cur, `{"metadata":{"finalizers":null}}`)
}

// Mixed limits on one lock: the line never deadlocks, and a pod with the
// smaller limit at the head holds back only the pods that wait for the
// same slots: one behind it with room below its larger limit is let in.
func TestAttackMixedLimitsHeadOfLine(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	l := locks.New(env.Client, nil)
	// Slot 0 is held by a holder of a semaphore of 3.
	var held locks.Acquired
	for i := 0; ; i++ {
		got, err := l.Acquire(ctx, ns, "hol", fmt.Sprintf("wide-%d", i), 600, 3)
		if err != nil || !got.Acquired {
			t.Fatal(got, err)
		}
		if got.Slot == 0 {
			held = got
			break
		}
		if ok, err := l.Release(ctx, ns, "hol", got.Slot, got.Token, got.Owner); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	narrow := gated(t, ns, "narrow", "hol") // limit 1: only slot 0
	told(t, narrow, "Waiting", "number 1 in line")
	gated(t, ns, "wide", "hol", gatedpod.LimitAnnotation, "3")
	b := admitted(t, ns, "wide")
	if p, _ := get(t, ns, "narrow"); !gatedpod.Gated(p) {
		t.Fatal("the pod of limit 1 was let in while slot 0 is held")
	}
	if ok, err := l.Release(ctx, ns, "hol", held.Slot, held.Token, held.Owner); err != nil || !ok {
		t.Fatal(ok, err)
	}
	a := admitted(t, ns, "narrow")
	t.Logf("then both run: narrow slot %s, wide slot %s: %v", a.Annotations[gatedpod.SlotAnnotation], b.Annotations[gatedpod.SlotAnnotation], running(t, ns))
}

// Pods deleted right after they are created, while the lock is free: the
// line may take a permit for a pod that is gone before its gate is lifted.
// Such a permit must be freed, and the line must go on.
func TestAttackCreateThenDeleteAtOnce(t *testing.T) {
	ctx := context.Background()
	ns := entitledNamespace(t)
	h := newAtkWatch()
	h.limitOf["flash"] = 1
	stop := h.start(t, ns)
	for i := range 20 {
		p := newGated(ns, fmt.Sprintf("flash-%02d", i), "flash")
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			time.Sleep(time.Duration(i) * 5 * time.Millisecond)
		}
		zero := int64(0)
		if err := env.Client.Delete(ctx, p, &client.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	last := gated(t, ns, "flash-last", "flash")
	p := admitted(t, ns, last.Name)
	permitOf(t, p)
	finish(t, p)
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return len(heldBy(t, ns, "flash", "")) == 0, nil
	})
	if err != nil {
		t.Fatalf("permits left: %v", heldBy(t, ns, "flash", ""))
	}
	stop()
	h.check(t)
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, v := range h.versions {
		if v.Spec.Lock == "flash" && v.Spec.AcquireTime != nil && v.Spec.RenewTime != nil && v.Spec.AcquireTime.Equal(v.Spec.RenewTime) {
			n++
		}
	}
	t.Logf("permits taken: %d (for %d pods let in: %v)", n, len(h.admittedOrder["flash"]), h.admittedOrder["flash"])
}

// A permit taken for a pod whose gate is lifted later (a leader that
// stopped between the acquire and the patch, and the new leader that lets
// the pod in once elected; or a letIn that conflicted and waits for the
// pod's next version) lives ttl + grace from the acquire, but the pod's
// ttl counts from admitted-at, stamped when the gate is lifted: the pod may
// then run (and terminate) past the permit's expireTime, when the expiry
// controller frees the slot for the next pod.
func TestAttackDelayedLetInOutlivesItsPermit(t *testing.T) {
	// Slow (it waits to show that nothing happens): skipped up front.
	fixedFinding(t, "the ttl of a gated pod counts from admitted-at (the manager's clock when the gate is lifted), while its permit expires ttl+grace after the acquire; when the patch comes later than the acquire (a new leader letting in a pod whose permit the old one took, or a conflicted patch), the pod is deleted, and its activeDeadlineSeconds set, later than the permit lasts, and the next pod is let in while it still runs. Count the pod's deadline from the permit's acquireTime (expireTime - grace), or renew the permit once at letIn")
	ctx := context.Background()
	ns := entitledNamespace(t)
	// The pod's own gate stands for the time between the acquire and the
	// patch: the line does not acquire while it is there.
	// The ttl outlasts the delay below: a pod whose ttl has already run
	// out when it is let in is deleted at once, before the test can read it.
	p := newGated(ns, "late", "late", gatedpod.TTLAnnotation, "30s")
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/hold"}}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	told(t, p, "OtherGates", "waits for its other scheduling gates")
	// The old leader's acquire, as the line makes it (owner, ttl + the
	// default grace of 30s, the pod named), under the manager's identity.
	l := locks.New(atkManager(t), nil)
	got, err := l.Acquire(ctx, ns, "late", "pod:"+string(p.UID), 30+30, 1, locks.HolderPod(ns, p.Name, string(p.UID)))
	if err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	// A failover takes a lease duration or more (15s by default); a few
	// seconds show the difference.
	time.Sleep(3 * time.Second)
	if err := atkMerge(t, env.Client, p, `{"spec":{"schedulingGates":[{"name":"locks.queen.dev/lock"}]}}`); err != nil {
		t.Fatal(err)
	}
	a := admitted(t, ns, "late")
	q := permitOf(t, a)
	at, err := time.Parse(gatedpod.TimeFormat, a.Annotations[gatedpod.AdmittedAt])
	if err != nil {
		t.Fatal(err)
	}
	// The pod is deleted at admitted-at + ttl (its activeDeadlineSeconds
	// is set to the same), and its containers may run its grace period
	// after that.
	podEnd := at.Add(30*time.Second + 30*time.Second)
	t.Logf("permit acquired %s, expires %s; pod admitted %s, may run until %s",
		q.Spec.AcquireTime.UTC().Format(gatedpod.TimeFormat), q.Spec.ExpireTime.UTC().Format(gatedpod.TimeFormat), at.Format(gatedpod.TimeFormat), podEnd.Format(gatedpod.TimeFormat))
	if podEnd.After(q.Spec.ExpireTime.Time) {
		t.Fatalf("the pod may run until %s, %s after its permit expires", podEnd.Format(gatedpod.TimeFormat), podEnd.Sub(q.Spec.ExpireTime.Time))
	}
}
