package election_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/election"
	"github.com/queen-locks/queen-locks/permit"
)

// gate pauses whoever passes it, as SIGSTOP pauses a process: a paused
// caller does not see its deadlines pass until it is let go.
type gate struct {
	mu     sync.Mutex
	ch     chan struct{} // nil while open
	parked atomic.Int32
}

func (g *gate) pause() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
}

func (g *gate) resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
}

func (g *gate) pass() {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	if ch != nil {
		g.parked.Add(1)
		<-ch
		g.parked.Add(-1)
	}
}

// stalled is a lock whose every call first passes a gate: the leader's
// renew loop stalls there.
type stalled struct {
	resourcelock.Interface
	g *gate
}

func (s stalled) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	s.g.pass()
	return s.Interface.Get(ctx)
}

func (s stalled) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	s.g.pass()
	return s.Interface.Create(ctx, r)
}

func (s stalled) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	s.g.pass()
	return s.Interface.Update(ctx, r)
}

// sent counts the writes of ConfigMaps a manager's connection sends. Each
// passes the gate first: a write held there is in flight, its guard read.
type sent struct {
	n    atomic.Int64
	gate *gate
}

func (s *sent) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		if r.Method != http.MethodGet && containsConfigMaps(r.URL.Path) {
			s.gate.pass()
			s.n.Add(1)
		}
		return rt.RoundTrip(r)
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func containsConfigMaps(path string) bool {
	const seg = "/configmaps"
	for i := 0; i+len(seg) <= len(path); i++ {
		if path[i:i+len(seg)] == seg {
			return true
		}
	}
	return false
}

// outcome is one write of a reconciler: its error, and the writes its
// connection had sent before and after it.
type outcome struct {
	err          error
	before, sent int64
}

// reconciler keeps the ConfigMap "state" in step, as a leader's reconciler
// would: it writes its identity and a count, through the manager's client,
// until the manager stops it.
type reconciler struct {
	id, ns   string
	c        client.Client
	r        client.Reader
	gate     *gate
	sent     *sent
	stubborn context.Context // when set, the reconciler ignores its manager's context for this one
	mu       sync.Mutex
	outcomes []outcome
}

func (w *reconciler) Start(ctx context.Context) error {
	if w.stubborn != nil {
		// Work that does not stop with its manager, as leader-only work
		// started during a shutdown does (controller-runtime#2719).
		go func() { _ = w.loop(w.stubborn) }()
		return nil
	}
	return w.loop(ctx)
}

func (w *reconciler) loop(ctx context.Context) error {
	tick := time.NewTicker(50 * time.Millisecond) // the pace of its work, not a wait for anything
	defer tick.Stop()
	for seq := 0; ; seq++ {
		w.gate.pass()
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		before := w.sent.n.Load()
		err := w.write(ctx, seq)
		if ctx.Err() != nil {
			return nil
		}
		w.mu.Lock()
		w.outcomes = append(w.outcomes, outcome{err: err, before: before, sent: w.sent.n.Load()})
		w.mu.Unlock()
	}
}

func (w *reconciler) write(ctx context.Context, seq int) error {
	cm := &corev1.ConfigMap{}
	err := w.r.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "state"}, cm)
	data := map[string]string{"writer": w.id, "seq": strconv.Itoa(seq)}
	switch {
	case apierrors.IsNotFound(err):
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "state"}, Data: data}
		return w.c.Create(ctx, cm)
	case err != nil:
		return err
	}
	cm.Data = data
	return w.c.Update(ctx, cm)
}

func (w *reconciler) since(i int) []outcome {
	w.mu.Lock()
	defer w.mu.Unlock()
	if i >= len(w.outcomes) {
		return nil
	}
	return append([]outcome(nil), w.outcomes[i:]...)
}

// replica is one controller-runtime manager leading through an
// election.Lock, with mgr.GetClient() the Lock's fenced client.
type replica struct {
	lock *election.Lock
	mgr  manager.Manager
	rec  *reconciler
	err  chan error // mgr.Start's answer
	stop context.CancelFunc
}

// replicaOptions are the faults a replica is made with.
type replicaOptions struct {
	wrap     func(resourcelock.Interface) resourcelock.Interface // around its lock, as client-go sees it
	writes   *gate                                               // its reconciler passes it before each write
	sends    *gate                                               // its ConfigMap writes pass it as they are sent
	lockHost string                                              // the address its lock reaches kube-apiserver at
	stubborn bool                                                // its reconciler goes on after its manager stopped
}

func startReplica(t *testing.T, ns, id string, o replicaOptions) *replica {
	t.Helper()
	lockCfg := rest.CopyConfig(env.Config)
	if o.lockHost != "" {
		lockCfg.Host = o.lockHost
	}
	if o.writes == nil {
		o.writes = &gate{}
	}
	writes, wrap := o.writes, o.wrap
	l, err := election.New(lockCfg, ns, "ctrl", id)
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{lock: l, err: make(chan error, 1)}
	if o.sends == nil {
		o.sends = &gate{}
	}
	s := &sent{gate: o.sends}
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(s.wrap)
	ld, rd, rp := leaseDuration, renewDeadline, retryPeriod
	var lock resourcelock.Interface = r.lock
	if wrap != nil {
		lock = wrap(lock)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Metrics:                             metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:              "0",
		Cache:                               cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		LeaderElection:                      true,
		LeaderElectionResourceLockInterface: lock,
		LeaseDuration:                       &ld,
		RenewDeadline:                       &rd,
		RetryPeriod:                         &rp,
		NewClient: func(cfg *rest.Config, o client.Options) (client.Client, error) {
			c, err := client.New(cfg, o)
			if err != nil {
				return nil, err
			}
			return r.lock.Client(c), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	r.mgr = mgr
	r.rec = &reconciler{id: id, ns: ns, c: mgr.GetClient(), r: mgr.GetAPIReader(), gate: writes, sent: s}
	if o.stubborn {
		stubborn, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		r.rec.stubborn = stubborn
	}
	if err := mgr.Add(r.rec); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go func() { r.err <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		writes.resume()
		o.sends.resume()
		cancel()
		if err := <-r.err; err != nil {
			t.Logf("%s's manager, stopped at the end: %v", id, err)
		}
	})
	return r
}

// event is one version of an object, as a watch delivered it.
type event struct {
	kind string // "ConfigMap" or "QueenLock"
	rv   uint64
	who  string // the ConfigMap's writer, the permit's owner
}

// history records every version of the namespace's ConfigMaps and permits,
// from the API server's watch: what was stored, not what a client saw.
type history struct {
	mu     sync.Mutex
	events []event
}

func record(t *testing.T, ns string) *history {
	t.Helper()
	h := &history{}
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for _, list := range []client.ObjectList{&corev1.ConfigMapList{}, &locksv1alpha1.QueenLockList{}} {
		w, err := c.Watch(ctx, list, client.InNamespace(ns))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for ev := range w.ResultChan() {
				if ev.Type != watch.Added && ev.Type != watch.Modified {
					continue
				}
				var e event
				switch o := ev.Object.(type) {
				case *corev1.ConfigMap:
					e = event{kind: "ConfigMap", who: o.Data["writer"]}
					if by, ok := o.Annotations[writtenBy]; ok {
						e.who = by // examples/fenced-controller's
					}
				case *locksv1alpha1.QueenLock:
					e = event{kind: "QueenLock", who: o.Spec.Owner}
				default:
					continue
				}
				e.rv, _ = permit.Token(ev.Object.(client.Object).GetResourceVersion())
				h.mu.Lock()
				h.events = append(h.events, e)
				h.mu.Unlock()
			}
		}()
	}
	return h
}

func (h *history) count(kind, who string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, e := range h.events {
		if e.kind == kind && e.who == who {
			n++
		}
	}
	return n
}

// takenOver is the version at which who first held the permit.
func (h *history) takenOver(who string) (uint64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range h.events {
		if e.kind == "QueenLock" && e.who == who {
			return e.rv, true
		}
	}
	return 0, false
}

func (h *history) writesAfter(who string, rv uint64) []event {
	h.mu.Lock()
	defer h.mu.Unlock()
	var late []event
	for _, e := range h.events {
		if e.kind == "ConfigMap" && e.who == who && e.rv > rv {
			late = append(late, e)
		}
	}
	return late
}

// The stale leader: a leads and writes; a is paused past its lease with a
// write in flight (its guard read, not yet sent) and its renew loop
// stalled, as SIGSTOP would leave it; b takes over and writes; a's write is
// let go, then its renew loop.
//
// None of a's writes after the takeover is stored (read from the watch of
// the API server, not from a's client); the write in flight is refused by
// the webhook, every later one by a's own client, unsent; and a's manager
// stops as controller-runtime does on a lost lease.
func TestTheStaleLeaderCannotWrite(t *testing.T) {
	ns := env.Namespace(t, "stale")
	h := record(t, ns)
	renewA, sendsA := &gate{}, &gate{}
	a := startReplica(t, ns, "a", replicaOptions{
		wrap:  func(l resourcelock.Interface) resourcelock.Interface { return stalled{l, renewA} },
		sends: sendsA,
	})
	defer renewA.resume()
	await(t, "a to lead", a.mgr.Elected())
	eventually(t, "a's writes", func() bool { return h.count("ConfigMap", "a") >= 2 })

	// Pause a whole, with a write in flight.
	renewA.pause()
	sendsA.pause()
	eventually(t, "a write of a's in flight", func() bool { return sendsA.parked.Load() == 1 })
	pausedAt := len(a.rec.since(0))

	b := startReplica(t, ns, "b", replicaOptions{})
	await(t, "b to lead", b.mgr.Elected())
	eventually(t, "b's writes", func() bool { return h.count("ConfigMap", "b") >= 2 })
	takeover, ok := h.takenOver("b")
	if !ok {
		t.Fatal("the watch saw no permit of b's")
	}
	// Let a's write go while its renew loop is still stalled.
	sendsA.resume()
	eventually(t, "a's reconciler to write three times", func() bool { return len(a.rec.since(pausedAt)) >= 3 })
	late := a.rec.since(pausedAt)
	refusedFromTheFirst(t, late, true)
	if !errors.Is(a.lock.Lost(), election.ErrLost) || a.lock.Token() != 0 {
		t.Fatalf("a's lock after the refusal: lost %v, token %d", a.lock.Lost(), a.lock.Token())
	}

	// Let a's renew loop go: the manager stops as on any lost lease.
	renewA.resume()
	select {
	case err := <-a.err:
		if err == nil {
			t.Fatal("a's manager stopped without an error")
		}
		t.Logf("a's manager stopped: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("a's manager still runs a minute after its leadership was lost")
	}
	a.err <- nil // for the cleanup

	if late := h.writesAfter("a", takeover); len(late) > 0 {
		t.Fatalf("stored writes of a after b's takeover at %d: %v", takeover, late)
	}
	if p := getPermit(t, ns, "ctrl"); p.Spec.Owner != "b" {
		t.Fatalf("the permit is %s's", p.Spec.Owner)
	}
	fmt.Fprintf(testWriter{t}, "takeover at %d; a stored %d writes before it; b %d after\n", takeover, h.count("ConfigMap", "a"), h.count("ConfigMap", "b"))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
