package guard_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/guard"
	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/permit"
)

// transports runs f with handles over the route, straight over the API,
// and in the chart's topology: two route replicas behind one address, the
// pod's projected token, the locks in another namespace than the pod.
func transports(t *testing.T, f func(t *testing.T, ns string, tr handle.Transport)) {
	t.Helper()
	t.Run("production", func(t *testing.T) {
		tp := env.Production(t, controlplane.TopologyOptions{Prefix: "guard"})
		f(t, tp.LockNS, handle.HTTP(tp.URL, handle.HTTPOptions{Namespace: tp.LockNS, TokenFile: tp.TokenFile}))
	})
	t.Run("http", func(t *testing.T) {
		ns := namespace(t)
		f(t, ns, handle.HTTP(startRoute(t, ns), handle.HTTPOptions{}))
	})
	t.Run("kube", func(t *testing.T) {
		ns := namespace(t)
		f(t, ns, handle.Kube(env.Client, ns))
	})
}

func acquire(t *testing.T, h *handle.Handle) {
	t.Helper()
	if ok, err := h.Acquire(context.Background()); !ok || err != nil {
		t.Fatalf("acquire %s: %v %v (%s)", h.Name(), ok, err, h.Reason())
	}
	t.Cleanup(func() { _ = h.Release(context.Background()) })
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// fenced checks that the stored object is guarded, bound to lock slot 0,
// with a record no newer than the handle's token, and keeps no guard.
func fenced(t *testing.T, cm *corev1.ConfigMap, h *handle.Handle) {
	t.Helper()
	if cm.Labels[permit.GuardedLabel] != "true" {
		t.Fatalf("%s is not labelled guarded: %v", cm.Name, cm.Labels)
	}
	if _, ok := cm.Annotations[permit.GuardAnnotation]; ok {
		t.Fatalf("%s kept the guard annotation: %v", cm.Name, cm.Annotations)
	}
	rec, bound, err := permit.ParseFence(cm.Annotations[permit.FenceAnnotation])
	if err != nil || !bound || rec.Lock != h.Name() || rec.Slot != 0 || rec.Token > h.Token() {
		t.Fatalf("%s record %q (%v), want lock %s slot 0 no newer than token %d", cm.Name, cm.Annotations[permit.FenceAnnotation], err, h.Name(), h.Token())
	}
}

// Every kind of write the holder makes through the guarded client is
// admitted: the webhook sees each carry the current guard. Creates are
// labelled guarded; an object of a kind that is not guarded is sent as it
// is, with no guard to give away.
func TestTheHolderWritesThroughTheGuardedClient(t *testing.T) {
	transports(t, func(t *testing.T, ns string, tr handle.Transport) {
		ctx := context.Background()
		h := handle.New(tr).Lock("report", 30*time.Second)
		acquire(t, h)
		hc, _ := hookedClient(t, ns)
		c := h.Client(hc)

		cm := configMap(ns, "out", "created")
		if err := c.Create(ctx, cm); err != nil {
			t.Fatalf("create: %v", err)
		}
		fenced(t, storedConfigMap(t, ns, "out"), h)
		if _, ok := cm.Annotations[permit.GuardAnnotation]; ok {
			t.Fatalf("the caller's object carries the guard after the create: %v", cm.Annotations)
		}

		cm.Data["report"] = "updated"
		if err := c.Update(ctx, cm); err != nil {
			t.Fatalf("update: %v", err)
		}
		before := cm.DeepCopy()
		cm.Data["report"] = "merge-patched"
		if err := c.Patch(ctx, cm, client.MergeFrom(before)); err != nil {
			t.Fatalf("merge patch: %v", err)
		}
		if err := c.Patch(ctx, cm, client.RawPatch(types.StrategicMergePatchType, []byte(`{"data":{"report":"strategic"}}`))); err != nil {
			t.Fatalf("strategic merge patch: %v", err)
		}
		if err := c.Patch(ctx, cm, client.RawPatch(types.JSONPatchType, []byte(`[{"op":"replace","path":"/data/report","value":"json-patched"}]`))); err != nil {
			t.Fatalf("JSON patch: %v", err)
		}
		got := storedConfigMap(t, ns, "out")
		if got.Data["report"] != "json-patched" {
			t.Fatalf("stored %q", got.Data["report"])
		}
		fenced(t, got, h)

		ac := corev1ac.ConfigMap("applied", ns).WithData(map[string]string{"report": "applied"})
		if err := c.Apply(ctx, ac, client.FieldOwner("report-writer")); err != nil {
			t.Fatalf("apply: %v", err)
		}
		fenced(t, storedConfigMap(t, ns, "applied"), h)
		if ac.ResourceVersion == nil || *ac.ResourceVersion == "" {
			t.Fatalf("the apply configuration was not given the answer: %+v", ac.ObjectMetaApplyConfiguration)
		}

		sa := &corev1.ServiceAccount{}
		sa.Namespace, sa.Name = ns, "unguarded"
		if err := c.Create(ctx, sa); err != nil {
			t.Fatalf("create of an unguarded kind: %v", err)
		}
		if len(sa.Labels) != 0 || len(sa.Annotations) != 0 {
			t.Fatalf("an object of an unguarded kind was given %v %v", sa.Labels, sa.Annotations)
		}

		for _, name := range []string{"out", "applied"} {
			if err := c.Delete(ctx, configMap(ns, name, "")); err != nil {
				t.Fatalf("delete %s: %v", name, err)
			}
			err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &corev1.ConfigMap{})
			if !apierrors.IsNotFound(err) {
				t.Fatalf("%s after the delete: %v", name, err)
			}
		}
		if !h.Held() {
			t.Fatalf("the handle lost its lock: %s", h.Reason())
		}
	})
}

// A holder whose lock was taken over has its next write refused with
// kv_precondition; the handle reports the loss with reason guard, and the
// client sends nothing more.
func TestAReplacedHolderLosesItsLockAndSendsNoMore(t *testing.T) {
	transports(t, func(t *testing.T, ns string, tr handle.Transport) {
		ctx := context.Background()
		a := handle.New(tr).Lock("report", time.Minute)
		lost := make(chan string, 1)
		a.OnLost(func(reason string) { lost <- reason })
		acquire(t, a)
		hc, hk := hookedClient(t, ns)
		c := a.Client(hc)
		cm := configMap(ns, "out", "by a")
		if err := c.Create(ctx, cm); err != nil {
			t.Fatal(err)
		}

		// The lock is taken over while a still thinks it holds it: its
		// permit released by hand, and b acquires.
		direct := handle.Kube(env.Client, ns)
		if ok, err := direct.Release(ctx, "report", 0, a.Token(), a.Owner()); !ok || err != nil {
			t.Fatalf("releasing a's permit by hand: %v %v", ok, err)
		}
		b := handle.New(direct).Lock("report", time.Minute)
		acquire(t, b)
		if err := b.Client(env.Client).Update(ctx, storedConfigMap(t, ns, "out")); err != nil {
			t.Fatalf("b's write: %v", err)
		}

		cm.Data["report"] = "by a, after the takeover"
		err := c.Update(ctx, cm)
		if !errors.Is(err, guard.ErrLost) || !guard.IsRefused(err) || !strings.Contains(err.Error(), "kv_precondition") {
			t.Fatalf("a's write after the takeover: %v; want a kv_precondition refusal and ErrLost", err)
		}
		t.Logf("a replaced holder sees: %v", err)
		select {
		case r := <-lost:
			if r != handle.LostGuard {
				t.Fatalf("lost with reason %q, want guard", r)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the handle never reported the loss")
		}
		if a.Held() || a.Reason() != handle.LostGuard {
			t.Fatalf("a: held %v reason %q", a.Held(), a.Reason())
		}
		if _, ok := cm.Annotations[permit.GuardAnnotation]; ok {
			t.Fatalf("the refused object kept the guard: %v", cm.Annotations)
		}

		sent, _ := hk.count()
		for _, write := range []func() error{
			func() error { return c.Update(ctx, cm) },
			func() error { return c.Create(ctx, configMap(ns, "another", "by a")) },
			func() error { return c.Patch(ctx, cm, client.MergeFrom(cm)) },
			func() error { return c.Delete(ctx, cm) },
		} {
			if err := write(); !errors.Is(err, guard.ErrLost) {
				t.Fatalf("a write after the loss: %v, want ErrLost", err)
			}
		}
		if now, _ := hk.count(); now != sent {
			t.Fatalf("%d requests sent after the loss, want none", now-sent)
		}
		if got := storedConfigMap(t, ns, "out"); got.Data["report"] != "by a" {
			t.Fatalf("stored %q", got.Data["report"])
		}
	})
}

var sentGuard = regexp.MustCompile(`report#0=([0-9]+)`)

// guardOf reads the guard a request carries, leaving its body for sending.
func guardOf(t *testing.T, r *http.Request) string {
	t.Helper()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		t.Error(err)
	}
	r.Body = io.NopCloser(strings.NewReader(string(body)))
	return sentGuard.FindString(string(body))
}

// A renew between the client's read of the token and the webhook's check
// makes the holder's own write stale. Made on purpose: the first write is
// held back until the handle has renewed. It is sent again with the new
// token and admitted, and no loss is reported.
func TestAWriteRacingTheHoldersRenewIsSentAgain(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	a := handle.New(handle.Kube(env.Client, ns)).Lock("report", 3*time.Second)
	lost := make(chan string, 1)
	a.OnLost(func(reason string) { lost <- reason })
	acquire(t, a)
	hc, hk := hookedClient(t, ns)
	c := a.Client(hc)

	var mu sync.Mutex
	var guards []string
	hk.set(func(r *http.Request) {
		g := guardOf(t, r)
		mu.Lock()
		guards = append(guards, g)
		first := len(guards) == 1
		mu.Unlock()
		if first {
			eventually(t, "a renew after the token was read", func() bool { return a.Token() > tokenIn(t, g) })
		}
	}, nil)
	if err := c.Create(ctx, configMap(ns, "out", "by a")); err != nil {
		t.Fatalf("the create that raced a renew: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(guards) != 2 || guards[0] == guards[1] {
		t.Fatalf("guards sent %q, want two, the second with the renewed token", guards)
	}
	if rec := storedConfigMap(t, ns, "out").Annotations[permit.FenceAnnotation]; rec != guards[1] {
		t.Fatalf("record %q, want %q", rec, guards[1])
	}
	select {
	case r := <-lost:
		t.Fatalf("the handle reported a loss (%s) for its own renew", r)
	default:
	}
}

// A renew the handle has not heard of (another handle of the same owner
// renewed, or a renew whose answer was lost) also moves the token: the
// client reads the permit, finds the same owner holding a newer token, and
// sends the write again with it.
func TestAWriteStaleByARenewTheHandleNeverHeardIsSentAgain(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	direct := handle.Kube(env.Client, ns)
	a := handle.New(direct).Lock("report", time.Minute)
	acquire(t, a)
	hc, hk := hookedClient(t, ns)
	c := a.Client(hc)

	var guards []string
	var renewed uint64
	hk.set(func(r *http.Request) {
		guards = append(guards, guardOf(t, r))
		if len(guards) == 1 {
			rn, err := direct.Renew(ctx, "report", 0, a.Token(), a.Owner(), 60)
			if err != nil || !rn.Renewed {
				t.Errorf("renewing behind the handle's back: %+v %v", rn, err)
			}
			renewed = rn.Token
		}
	}, nil)
	if err := c.Create(ctx, configMap(ns, "out", "by a")); err != nil {
		t.Fatalf("the create: %v", err)
	}
	if len(guards) != 2 || tokenIn(t, guards[1]) != renewed {
		t.Fatalf("guards sent %q, want the second with token %d", guards, renewed)
	}
	if !a.Held() {
		t.Fatalf("the handle lost its lock: %s", a.Reason())
	}
}

// A delete is a mark under the guard, then the delete from the marked
// version. A renew between the two makes the webhook refuse the delete;
// the client marks again under the new token and deletes.
func TestADeleteRacingTheHoldersRenewIsSentAgain(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	a := handle.New(handle.Kube(env.Client, ns)).Lock("report", 3*time.Second)
	acquire(t, a)
	hc, hk := hookedClient(t, ns)
	c := a.Client(hc)
	if err := c.Create(ctx, configMap(ns, "out", "by a")); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	var sent []string
	hk.set(func(r *http.Request) {
		sent = append(sent, r.Method)
		if r.Method == http.MethodDelete {
			once.Do(func() {
				marked := tokenIn(t, storedConfigMap(t, ns, "out").Annotations[permit.FenceAnnotation])
				eventually(t, "a renew after the mark", func() bool { return a.Token() > marked || !a.Held() })
				if !a.Held() {
					t.Errorf("the handle lost its lock while the delete waited for its renew: %s (marked %d, token %d)", a.Reason(), marked, a.Token())
				}
			})
		}
	}, nil)
	if err := c.Delete(ctx, configMap(ns, "out", "")); err != nil {
		t.Fatalf("the delete that raced a renew: %v", err)
	}
	if strings.Join(sent, " ") != "PATCH DELETE PATCH DELETE" {
		t.Fatalf("sent %v, want a mark and a delete, twice", sent)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "out"}, &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after the delete: %v", err)
	}
	if !a.Held() {
		t.Fatalf("the handle lost its lock: %s", a.Reason())
	}
}

func TestADryRunDeleteWritesNothing(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	a := handle.New(handle.Kube(env.Client, ns)).Lock("report", 30*time.Second)
	acquire(t, a)
	c := a.Client(env.Client)
	if err := c.Create(ctx, configMap(ns, "out", "by a")); err != nil {
		t.Fatal(err)
	}
	before := storedConfigMap(t, ns, "out")
	if err := c.Delete(ctx, configMap(ns, "out", ""), client.DryRunAll); err != nil {
		t.Fatalf("a dry-run delete by the holder: %v", err)
	}
	after := storedConfigMap(t, ns, "out")
	if after.ResourceVersion != before.ResourceVersion {
		t.Fatalf("a dry-run delete wrote the object: version %s, then %s (annotations %v)", before.ResourceVersion, after.ResourceVersion, after.Annotations)
	}
	if _, marked := after.Annotations[permit.DeletableAnnotation]; marked {
		t.Fatal("a dry-run delete left the deletable mark")
	}
	if !a.Held() {
		t.Fatalf("the handle lost its lock: %s", a.Reason())
	}
}

func tokenIn(t *testing.T, guard string) uint64 {
	t.Helper()
	g, err := permit.ParseGuard(guard)
	if err != nil {
		t.Errorf("guard %q: %v", guard, err)
	}
	return g.Token
}

// A refusal while the permit is still held with the very token sent is
// about the object, not the holding (here: it is bound to another lock). It
// is answered as the webhook said it, and nothing is lost.
func TestARefusalAboutTheObjectIsNoLoss(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	c := handle.New(handle.Kube(env.Client, ns))
	a, other := c.Lock("report", time.Minute), c.Lock("other", time.Minute)
	acquire(t, a)
	acquire(t, other)
	hc, _ := hookedClient(t, ns)
	if err := other.Client(hc).Create(ctx, configMap(ns, "theirs", "by other")); err != nil {
		t.Fatal(err)
	}
	ac := a.Client(hc)
	cm := storedConfigMap(t, ns, "theirs")
	cm.Data["report"] = "by a"
	err := ac.Update(ctx, cm)
	if !guard.IsRefused(err) || errors.Is(err, guard.ErrLost) || !strings.Contains(err.Error(), `bound to lock "other"`) {
		t.Fatalf("a's write of another lock's object: %v; want the webhook's refusal, not a loss", err)
	}
	if !a.Held() || ac.Lost() {
		t.Fatalf("a lost its lock (%s) over another lock's object", a.Reason())
	}
	if err := ac.Create(ctx, configMap(ns, "ours", "by a")); err != nil {
		t.Fatalf("a's next write: %v", err)
	}
}
