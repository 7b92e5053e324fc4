package cluster_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/queen-locks/queen-locks/permit"
)

// examples/fenced-controller on the node: two replicas elect a leader over
// a QueenLock permit (package election) and keep a guarded ConfigMap in
// step with another.
const (
	fencedNS      = "fenced-e2e"
	fencedImage   = "queen-locks.test/e2e/fenced-controller:1" // make e2e-images
	fencedLock    = "fenced-controller"                        // the example's default --lock
	fencedSource  = "settings"
	fencedTarget  = "settings-copy"
	fencedWriter  = "example.queen.dev/written-by" // the example's WrittenBy
	fencedExample = "examples/fenced-controller"
	fencedBinary  = "/fenced-controller" // the image's entrypoint
)

// fencedHistory records every stored version of the target and of the
// permit, from a watch of the API server: what was stored, whoever sent
// it, not what a replica's client believed.
type fencedHistory struct {
	mu     sync.Mutex
	events []fencedEvent
}

type fencedEvent struct {
	kind, who string // "ConfigMap" (who wrote it) or "QueenLock" (who holds it)
	rv        uint64
	colour    string
}

func recordFenced(t *testing.T, ctx context.Context) *fencedHistory {
	t.Helper()
	h := &fencedHistory{}
	cms, err := c.Client.CoreV1().ConfigMaps(fencedNS).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + fencedTarget})
	if err != nil {
		t.Fatal(err)
	}
	permits, err := dynamic.NewForConfigOrDie(c.Rest).Resource(queenlocks).Namespace(fencedNS).
		Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + permit.Name(fencedLock, 0)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cms.Stop)
	t.Cleanup(permits.Stop)
	for _, w := range []watch.Interface{cms, permits} {
		go func() {
			for ev := range w.ResultChan() {
				if ev.Type != watch.Added && ev.Type != watch.Modified {
					continue
				}
				var e fencedEvent
				switch o := ev.Object.(type) {
				case *corev1.ConfigMap:
					e = fencedEvent{kind: "ConfigMap", who: o.Annotations[fencedWriter], colour: o.Data["colour"]}
				case *unstructured.Unstructured:
					owner, _, _ := unstructured.NestedString(o.Object, "spec", "owner")
					e = fencedEvent{kind: "QueenLock", who: owner}
				default:
					continue
				}
				e.rv, _ = permit.Token(ev.Object.(metav1.Object).GetResourceVersion())
				h.mu.Lock()
				h.events = append(h.events, e)
				h.mu.Unlock()
			}
		}()
	}
	return h
}

// heldBy is the version at which who first held the permit.
func (h *fencedHistory) heldBy(who string) (uint64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range h.events {
		if e.kind == "QueenLock" && e.who == who {
			return e.rv, true
		}
	}
	return 0, false
}

// writes are the stored versions of the target that who wrote after rv.
func (h *fencedHistory) writes(who string, after uint64) []fencedEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []fencedEvent
	for _, e := range h.events {
		if e.kind == "ConfigMap" && e.who == who && e.rv > after {
			out = append(out, e)
		}
	}
	return out
}

// applyFencedExample applies the example's RBAC and Deployment as written,
// in the test's namespace and with the image make e2e-images built.
func applyFencedExample(t *testing.T, ctx context.Context) {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"rbac.yaml", "deployment.yaml"} {
		raw, err := os.ReadFile(filepath.Join(root, fencedExample, f))
		if err != nil {
			t.Fatal(err)
		}
		s := strings.ReplaceAll(string(raw), "namespace: team-a", "namespace: "+fencedNS)
		s = strings.ReplaceAll(s, "image: example.com/fenced-controller:latest", "image: "+fencedImage)
		if !strings.Contains(s, fencedImage) && f == "deployment.yaml" {
			t.Fatalf("%s/%s names no image this test knows to replace", fencedExample, f)
		}
		out := filepath.Join(dir, f)
		if err := os.WriteFile(out, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Kubectl(ctx, bin, "apply", "-f", out); err != nil {
			t.Fatal(err)
		}
	}
}

// fencedTargetOf reads the target: its colour and who wrote it.
func fencedTargetOf(ctx context.Context) (colour, writer string, err error) {
	cm, err := c.Client.CoreV1().ConfigMaps(fencedNS).Get(ctx, fencedTarget, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", "", nil
	}
	if err != nil {
		return "", "", err
	}
	return cm.Data["colour"], cm.Annotations[fencedWriter], nil
}

// fencedHolder is the permit's owner and holder pod, "" when it is free.
func fencedHolder(ctx context.Context) (owner, pod string, err error) {
	u, err := dynamic.NewForConfigOrDie(c.Rest).Resource(queenlocks).Namespace(fencedNS).Get(ctx, permit.Name(fencedLock, 0), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", "", nil
	}
	if err != nil {
		return "", "", err
	}
	owner, _, _ = unstructured.NestedString(u.Object, "spec", "owner")
	pod, _, _ = unstructured.NestedString(u.Object, "spec", "holderPod", "name")
	return owner, pod, nil
}

func setColour(t *testing.T, ctx context.Context, colour string) {
	t.Helper()
	cm, err := c.Client.CoreV1().ConfigMaps(fencedNS).Get(ctx, fencedSource, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["colour"] = colour
	if _, err := c.Client.CoreV1().ConfigMaps(fencedNS).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// controllerProcess finds the example's process of a pod on this node:
// the one running the image's entrypoint in the pod's cgroup.
func controllerProcess(t *testing.T, uid string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var found []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cg, err1 := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		cmd, err2 := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err1 != nil || err2 != nil {
			continue // gone meanwhile
		}
		argv0, _, _ := strings.Cut(string(cmd), "\x00")
		// The kubelet names a pod's cgroup pod<UID> (cgroupfs), or with
		// underscores for dashes (systemd).
		inPod := strings.Contains(string(cg), "pod"+uid) || strings.Contains(string(cg), "pod"+strings.ReplaceAll(uid, "-", "_"))
		if argv0 == fencedBinary && inPod {
			found = append(found, pid)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %s process in pod %s's cgroup, found %v", fencedBinary, uid, found)
	}
	return found[0]
}

func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, s := range p.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}

// TestFencedControllerFailover: examples/fenced-controller's two replicas
// as pods. The leader's process is frozen on the node (SIGSTOP) past its
// lease; the other replica takes the permit over and writes the target;
// the first is thawed. None of its writes after the takeover is stored
// (read from a watch of the API server), and its process ends as
// controller-runtime ends it on a lost lease, to come back as a follower.
func TestFencedControllerFailover(t *testing.T) {
	needInstall(t)
	ctx := context.Background()
	createNamespace(t, ctx, fencedNS)
	t.Cleanup(func() {
		_ = c.Client.CoreV1().Namespaces().Delete(context.Background(), fencedNS, metav1.DeleteOptions{})
	})
	applyFencedExample(t, ctx)
	if _, err := c.Client.CoreV1().ConfigMaps(fencedNS).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: fencedSource}, Data: map[string]string{"colour": "blue"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var leaderID string
	await(t, "a replica leads and writes the target", 3*time.Minute, func(ctx context.Context) (bool, error) {
		colour, writer, err := fencedTargetOf(ctx)
		leaderID = writer
		return colour == "blue" && writer != "", err
	})
	owner, podName, err := fencedHolder(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if owner != leaderID || podName == "" {
		t.Fatalf("the target was written by %q, but the permit is held by %q (pod %q)", leaderID, owner, podName)
	}
	pod, err := c.Client.CoreV1().Pods(fencedNS).Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before := restarts(pod)
	hist := recordFenced(t, ctx)
	t.Logf("leader %s in pod %s", leaderID, podName)

	pid := controllerProcess(t, string(pod.UID))
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(thaw)

	var next string
	await(t, "the other replica takes the permit over", 2*time.Minute, func(ctx context.Context) (bool, error) {
		o, _, err := fencedHolder(ctx)
		next = o
		return o != "" && o != leaderID, err
	})
	t.Logf("taken over by %s %s after the freeze", next, time.Since(frozen).Round(100*time.Millisecond))
	setColour(t, ctx, "green")
	await(t, "the new leader writes the target", time.Minute, func(ctx context.Context) (bool, error) {
		colour, writer, err := fencedTargetOf(ctx)
		return colour == "green" && writer == next, err
	})
	// Something for the old leader to write when it wakes: its cache still
	// holds the old target.
	setColour(t, ctx, "red")
	thaw()
	await(t, "the old leader's process ends and its container restarts", 2*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(fencedNS).Get(ctx, podName, metav1.GetOptions{})
		return err == nil && restarts(p) > before, err
	})
	await(t, "the new leader writes the target again", time.Minute, func(ctx context.Context) (bool, error) {
		colour, writer, err := fencedTargetOf(ctx)
		return colour == "red" && writer == next, err
	})
	if prev, err := c.Client.CoreV1().Pods(fencedNS).GetLogs(podName, &corev1.PodLogOptions{Previous: true}).DoRaw(ctx); err == nil {
		lines := strings.Split(strings.TrimSpace(string(prev)), "\n")
		t.Logf("the old leader's last lines:\n%s", strings.Join(lines[max(0, len(lines)-6):], "\n"))
	}

	took, ok := hist.heldBy(next)
	if !ok {
		t.Fatalf("the watch never saw %s hold the permit", next)
	}
	if late := hist.writes(leaderID, took); len(late) > 0 {
		t.Errorf("the old leader's writes after the takeover at %d were stored: %+v", took, late)
	}
	if len(hist.writes(next, took)) == 0 {
		t.Errorf("no write of the new leader was stored after its takeover at %d", took)
	}
}
