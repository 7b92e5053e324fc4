package gate_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/permit/gatedpod"
)

// startReplica runs one more manager replica with leader election and gated
// pods on, under the manager's ServiceAccount. Only the replica given the
// envtest webhook port answers the webhooks.
func startReplica(t *testing.T, e *controlplane.Env, webhookPort int) (mgr ctrl.Manager, stop func()) {
	t.Helper()
	cfg, err := controlplane.AsManagerServiceAccount(e)
	if err != nil {
		t.Fatal(err)
	}
	wo := e.Env.WebhookInstallOptions
	mgr, err = manager.New(cfg, manager.Options{
		MetricsAddr: "0", ProbeAddr: "0",
		WebhookHost: wo.LocalServingHost, WebhookPort: webhookPort, CertDir: wo.LocalServingCertDir,
		ExpiryGrace: 200 * time.Millisecond, GatedPods: true,
		LeaderElect: true, LeaderElectionNamespace: "queen-locks",
		SkipNameValidation: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("replica: %v", err)
		}
	}()
	return mgr, func() { cancel(); <-done }
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// history records every version of the namespace's pods, in order.
type history struct {
	mu      sync.Mutex
	tokens  map[string][]string // pod name: each distinct token it carried
	pods    map[string]*corev1.Pod
	maxHeld int // most pods let in and not finished at once
}

func (h *history) observe(p *corev1.Pod, deleted bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if tok := p.Annotations[gatedpod.TokenAnnotation]; tok != "" {
		ts := h.tokens[p.Name]
		if len(ts) == 0 || ts[len(ts)-1] != tok {
			h.tokens[p.Name] = append(ts, tok)
		}
	}
	if deleted {
		delete(h.pods, p.Name)
	} else {
		h.pods[p.Name] = p
	}
	held := 0
	for _, q := range h.pods {
		if !gatedpod.Gated(q) && !gatedpod.Finished(q) {
			held++
		}
	}
	h.maxHeld = max(h.maxHeld, held)
}

// A leader change in the middle of a line lets no pod in twice, and never
// two at once: the line is derived from the pods, and a permit the old
// leader took for a pod it had not yet let in is found again by the new
// leader as the same owner's.
func TestALeaderChangeLetsNoPodInTwice(t *testing.T) {
	e, err := controlplane.Start(controlplane.Options{GatedPods: true, NoManager: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Stop() }()
	ctx := context.Background()

	// The first replica leads; the second, started once the first is
	// elected, serves the webhook and waits to lead.
	leader, stopLeader := startReplica(t, e, freePort(t))
	defer func() {
		if stopLeader != nil {
			stopLeader()
		}
	}()
	<-leader.Elected()
	follower, stopFollower := startReplica(t, e, e.Env.WebhookInstallOptions.LocalServingPort)
	defer stopFollower()
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return follower.GetWebhookServer().StartedChecker()(nil) == nil, nil
	})
	if err != nil {
		t.Fatal("the second replica's webhook did not start")
	}

	saved := env
	env = e // the helpers act on this control plane
	defer func() { env = saved }()
	ns := entitledNamespace(t)

	h := &history{tokens: map[string][]string{}, pods: map[string]*corev1.Pod{}}
	w, err := e.Clientset.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok {
				h.observe(p, ev.Type == watch.Deleted)
			}
		}
	}()

	const n = 6
	for i := range n {
		gated(t, ns, fmt.Sprintf("run-%d", i), "migration")
	}
	for i := range n {
		p := admitted(t, ns, fmt.Sprintf("run-%d", i))
		finish(t, p)
		if i == 2 {
			// The leader goes right after a pod ends: it may be between
			// taking the next pod's permit and lifting its gate.
			stopLeader()
			stopLeader = nil
		}
	}
	select {
	case <-follower.Elected():
	default:
		t.Fatal("the second replica never led: the test did not change leaders")
	}
	w.Stop()
	<-watched
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.maxHeld != 1 {
		t.Fatalf("at most %d pods were let in at once, want 1", h.maxHeld)
	}
	for i := range n {
		name := fmt.Sprintf("run-%d", i)
		if ts := h.tokens[name]; len(ts) != 1 {
			t.Fatalf("pod %s carried tokens %v, want exactly one", name, ts)
		}
	}
}
