package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/permit/gatedpod"
)

// The gated rows measure how a lock passes from one gated pod
// (docs/gated-pods.md) to the next in line: batches of gatedBatch pods of one lock
// are queued, and each is finished (its status phase set to Succeeded, as
// the kubelet would; no kubelet runs here) gatedHold after a pod watch
// sees its gate lifted. Three moments of this process's clock:
//
//   - finished: the answer to the status patch that marks the pod Succeeded;
//   - freed: a watch of the namespace's permits sees the pod's permit
//     deleted;
//   - admitted: the pod watch's first event of the next pod without the
//     gate locks.queen.dev/lock.
//
// The baseline, taken in turns with the batches on the same control plane,
// is the wake-up rows' handoff: a release through the route to the acquire
// of the next waiter woken by waitSeconds.

const (
	gatedBatch   = 10               // gated pods queued on the lock at once
	gatedSamples = 200              // handoffs measured, at least
	gatedTarget  = time.Second      // the bound on the p99 from finish to next admitted
	gatedStep    = 30 * time.Second // the longest one pod may take to be let in or freed
	// gatedHold is how long an admitted pod runs before it is finished:
	// long enough for the line to settle (its try for the next pod,
	// refused while the lock is held, is over), as it has for any pod that
	// runs for real. A pod finished at once would race that try, and the
	// next pod would sometimes be let in by it, sooner than any real one.
	gatedHold = 250 * time.Millisecond
	gatedNS   = "bench-gated"
	gatedLock = "gated-handoff"
	gatedSA   = "job"
)

// gatedGaps are the gated section's samples.
type gatedGaps struct {
	finished []time.Duration // a pod finished to the next pod admitted
	freed    []time.Duration // its permit deleted to the next pod admitted
	freeing  []time.Duration // a pod finished to its permit deleted
	baseline []time.Duration // a route release to the next waiter's acquire
}

// stamps records when this process first saw each key, and lets a caller
// wait for one.
type stamps struct {
	mu   sync.Mutex
	at   map[string]time.Time
	seen map[string]chan struct{}
}

func newStamps() *stamps {
	return &stamps{at: map[string]time.Time{}, seen: map[string]chan struct{}{}}
}

func (s *stamps) chanLocked(key string) chan struct{} {
	ch, ok := s.seen[key]
	if !ok {
		ch = make(chan struct{})
		s.seen[key] = ch
	}
	return ch
}

// mark records key at at, unless it was seen before.
func (s *stamps) mark(key string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.at[key]; ok {
		return
	}
	s.at[key] = at
	close(s.chanLocked(key))
}

// wait answers when key was seen, waiting at most d for it.
func (s *stamps) wait(key string, d time.Duration) (time.Time, error) {
	s.mu.Lock()
	if at, ok := s.at[key]; ok {
		s.mu.Unlock()
		return at, nil
	}
	ch := s.chanLocked(key)
	s.mu.Unlock()
	select {
	case <-ch:
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.at[key], nil
	case <-time.After(d):
		return time.Time{}, fmt.Errorf("%s not seen within %s", key, d)
	}
}

// gapsAfter answers, for each end but the last, the time from it to the
// start that followed it: starts[i+1] - ends[i].
func gapsAfter(ends, starts []time.Time) []time.Duration {
	var out []time.Duration
	for i := 0; i+1 < len(starts) && i < len(ends); i++ {
		out = append(out, starts[i+1].Sub(ends[i]))
	}
	return out
}

// ratioOf is a to b, or 0 when b is.
func ratioOf(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// watchFunc adapts a function to client-go's WatcherWithContext.
type watchFunc func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error)

func (f watchFunc) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return f(ctx, o)
}

// follow runs a watch from rv until ctx ends, restarting it as needed, and
// hands each event to on with the time it arrived.
func follow(ctx context.Context, rv string, w watchFunc, on func(watch.Event, time.Time)) (done <-chan struct{}, err error) {
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, rv, w)
	if err != nil {
		return nil, err
	}
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		defer rw.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-rw.ResultChan():
				if !ok {
					return
				}
				on(ev, time.Now())
			}
		}
	}()
	return ch, nil
}

// gatedBench is the gated section's control plane and clients.
type gatedBench struct {
	env      *controlplane.Env
	cs       kubernetes.Interface // no client-side rate limit
	route    handle.Transport     // the route without auth, for the baseline
	admitted *stamps              // by pod name
	freed    *stamps              // by permit owner, pod:<uid>
}

// startGated brings up a control plane with gated pods on, a namespace
// whose ServiceAccount gatedSA may hold locks, a route, and the watches.
func startGated(ctx context.Context) (g *gatedBench, stop func(), err error) {
	opts := controlplane.Options{GatedPods: true}
	if featureGates != "" {
		opts.APIServerFlags = map[string]string{"feature-gates": featureGates}
	}
	env, err := controlplane.Start(opts)
	if err != nil {
		return nil, nil, err
	}
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
		_ = env.Stop()
	}
	fail := func(err error) (*gatedBench, func(), error) {
		stop()
		return nil, nil, err
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = -1, 0
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fail(err)
	}
	kc, err := client.NewWithWatch(cfg, client.Options{Scheme: manager.Scheme})
	if err != nil {
		return fail(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, nsObj(gatedNS), metav1.CreateOptions{}); err != nil {
		return fail(err)
	}
	// The pods' ServiceAccount may hold locks (the webhook and the line
	// check it), as a RoleBinding to the holder role grants.
	if _, err := cs.CoreV1().ServiceAccounts(gatedNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: gatedSA}}, metav1.CreateOptions{}); err != nil {
		return fail(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "holder"}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{locksv1alpha1.GroupVersion.Group}, Resources: []string{"queenlocks"},
		Verbs: []string{"create", "get", "list", "watch", "update", "patch", "delete"},
	}}}
	if _, err := cs.RbacV1().Roles(gatedNS).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return fail(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "holder"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "holder"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: gatedNS, Name: gatedSA}}}
	if _, err := cs.RbacV1().RoleBindings(gatedNS).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		return fail(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, gatedStep, true, func(ctx context.Context) (bool, error) {
		missing, err := gatedpod.Entitled(ctx, cs, gatedNS, gatedSA)
		return err == nil && missing == "", nil
	})
	if err != nil {
		return fail(fmt.Errorf("the holder role of %s/%s never took effect: %w", gatedNS, gatedSA, err))
	}
	url, stopRoute, err := env.StartRouteConfig(route.Config{Auth: route.AuthNone, DefaultNamespace: gatedNS})
	if err != nil {
		return fail(err)
	}
	stops = append(stops, stopRoute)
	g = &gatedBench{env: env, cs: cs, admitted: newStamps(), freed: newStamps(),
		route: handle.HTTP(url, handle.HTTPOptions{Namespace: gatedNS, Client: routeClient})}
	if err := waitRoute(g.route); err != nil {
		return fail(err)
	}

	wctx, cancel := context.WithCancel(ctx)
	var watching []<-chan struct{}
	stops = append(stops, func() {
		cancel()
		for _, w := range watching {
			<-w
		}
	})
	selector := gatedpod.Label + "=" + gatedpod.LabelValue
	pods, err := cs.CoreV1().Pods(gatedNS).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return fail(err)
	}
	w, err := follow(wctx, pods.ResourceVersion, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.LabelSelector = selector
		return cs.CoreV1().Pods(gatedNS).Watch(ctx, o)
	}, func(ev watch.Event, at time.Time) {
		if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type != watch.Deleted && !gatedpod.Gated(p) {
			g.admitted.mark(p.Name, at)
		}
	})
	if err != nil {
		return fail(err)
	}
	watching = append(watching, w)
	var permits locksv1alpha1.QueenLockList
	if err := kc.List(ctx, &permits, client.InNamespace(gatedNS)); err != nil {
		return fail(err)
	}
	w, err = follow(wctx, permits.ResourceVersion, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return kc.Watch(ctx, &locksv1alpha1.QueenLockList{}, &client.ListOptions{Namespace: gatedNS, Raw: &o})
	}, func(ev watch.Event, at time.Time) {
		if p, ok := ev.Object.(*locksv1alpha1.QueenLock); ok && ev.Type == watch.Deleted {
			g.freed.mark(p.Spec.Owner, at)
		}
	})
	if err != nil {
		return fail(err)
	}
	watching = append(watching, w)
	return g, stop, nil
}

// batch queues gatedBatch pods of the lock, finishes each gatedHold after
// it is let in, and adds the batch's gaps to into. The pods are deleted at the
// end, once the last one's permit is freed, as a Job's finished pods
// would be in time.
func (g *gatedBench) batch(ctx context.Context, n string, into *gatedGaps) error {
	pods := g.cs.CoreV1().Pods(gatedNS)
	batchLabel := "bench-batch-" + n
	var uids []types.UID
	for i := range gatedBatch {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gated-%s-%d", n, i),
				Labels:      map[string]string{gatedpod.Label: gatedpod.LabelValue, "bench-batch": batchLabel},
				Annotations: map[string]string{gatedpod.LockAnnotation: gatedLock}},
			Spec: corev1.PodSpec{ServiceAccountName: gatedSA, Containers: []corev1.Container{{Name: "job", Image: "job"}}},
		}
		created, err := pods.Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating gated pod %s: %w", p.Name, err)
		}
		if !gatedpod.Gated(created) {
			return fmt.Errorf("gated pod %s was created without its scheduling gate", p.Name)
		}
		uids = append(uids, created.UID)
	}
	finish := []byte(`{"status":{"phase":"Succeeded"}}`)
	var admitted, finished, freed []time.Time
	for i := range gatedBatch {
		name := fmt.Sprintf("gated-%s-%d", n, i)
		at, err := g.admitted.wait(name, gatedStep)
		if err != nil {
			return fmt.Errorf("gated pod %s was not let in: %w", name, err)
		}
		admitted = append(admitted, at)
		time.Sleep(gatedHold) // the work
		if _, err := pods.Patch(ctx, name, types.MergePatchType, finish, metav1.PatchOptions{}, "status"); err != nil {
			return fmt.Errorf("finishing gated pod %s: %w", name, err)
		}
		finished = append(finished, time.Now())
	}
	for i, uid := range uids {
		at, err := g.freed.wait("pod:"+string(uid), gatedStep)
		if err != nil {
			return fmt.Errorf("the permit of gated pod gated-%s-%d was not freed: %w", n, i, err)
		}
		freed = append(freed, at)
	}
	into.finished = append(into.finished, gapsAfter(finished, admitted)...)
	into.freed = append(into.freed, gapsAfter(freed, admitted)...)
	for i := range finished {
		into.freeing = append(into.freeing, freed[i].Sub(finished[i]))
	}
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "bench-batch=" + batchLabel}); err != nil {
		return fmt.Errorf("deleting batch %s: %w", n, err)
	}
	return nil
}

// counted runs one batch, not measured, between two scrapes of
// kube-apiserver's counters, and answers what it counted per handoff.
// It also warms the paths up before the measured batches.
func (g *gatedBench) counted(ctx context.Context) (string, error) {
	before, err := settledScrape(ctx, g.cs)
	if err != nil {
		return "", err
	}
	if err := g.batch(ctx, "counted", &gatedGaps{}); err != nil {
		return "", err
	}
	after, err := settledScrape(ctx, g.cs)
	if err != nil {
		return "", err
	}
	d := after.minus(before)
	return fmt.Sprintf("API calls per gated pod, in a batch of %d counted before the measured ones (kube-apiserver's counters; the bench's own create, status patch and delete of each pod included, watches left out): %s; admission webhook calls: %s.",
		gatedBatch, breakdown(d.api, gatedBatch, false), breakdown(d.webhooks, gatedBatch, false)), nil
}

// measure takes gated batches and baseline handoffs in turns until
// each has gatedSamples samples.
func (g *gatedBench) measure(ctx context.Context) (gatedGaps, error) {
	var out gatedGaps
	for n := 0; len(out.finished) < gatedSamples || len(out.baseline) < gatedSamples; n++ {
		if len(out.finished) < gatedSamples {
			if err := g.batch(ctx, fmt.Sprint(n), &out); err != nil {
				return out, err
			}
		}
		if len(out.baseline) < gatedSamples {
			// A lock of its own each turn: a waiter cancelled at the end of
			// a turn may leave a permit behind.
			d, err := handoffs([]handle.Transport{g.route}, fmt.Sprint("gated-baseline-", n), 1, 8, gatedBatch, true)
			if err != nil {
				return out, fmt.Errorf("baseline handoff: %w", err)
			}
			out.baseline = append(out.baseline, d...)
		}
		fmt.Fprint(os.Stderr, ".")
	}
	return out, nil
}

// gatedTable writes the gated rows, with their ratios to the baseline.
func gatedTable(g gatedGaps) string {
	var b strings.Builder
	b.WriteString("| gap | samples | p50 | p99 | p50 to baseline | p99 to baseline |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
	base50, base99 := percentile(g.baseline, 50), percentile(g.baseline, 99)
	row := func(name string, d []time.Duration, ratios bool) {
		p50, p99 := percentile(d, 50), percentile(d, 99)
		r50, r99 := "", ""
		if ratios {
			r50, r99 = fmt.Sprintf("%.1f", ratioOf(p50, base50)), fmt.Sprintf("%.1f", ratioOf(p99, base99))
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s |\n", name, len(d), ms(p50), ms(p99), r50, r99)
	}
	row("pod finished to next pod admitted", g.finished, true)
	row("permit freed to next pod admitted", g.freed, true)
	row("pod finished to its permit freed", g.freeing, false)
	row("baseline: route release to next waiter's acquire (1 lock, 8 waiters, waitSeconds)", g.baseline, true)
	return b.String()
}

// gatedVerdict says whether the run met the target on the gap from finish
// to next admitted.
func gatedVerdict(g gatedGaps) string {
	p99 := percentile(g.finished, 99)
	verdict := "not met"
	if len(g.finished) > 0 && p99 < gatedTarget {
		verdict = "met"
	}
	return fmt.Sprintf("Target, p99 from a gated pod's finish to the next pod's admission under %s: %s, %s over %d handoffs.", ms(gatedTarget), verdict, ms(p99), len(g.finished))
}

// gated is the gated pods' section: the handoff of a lock from one gated
// pod to the next, against the route's handoff on the same control plane.
func (bn *bench) gated() error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	// A control plane of its own: gated pods run the manager under its
	// ServiceAccount, watch labelled pods and add admission policies on
	// pods, which would change what the other sections measure.
	g, stop, err := startGated(ctx)
	if err != nil {
		return err
	}
	calls, err := g.counted(ctx)
	if err != nil {
		stop()
		return err
	}
	gaps, err := g.measure(ctx)
	stop()
	if err != nil {
		return err
	}
	took := time.Since(start)
	b := &bn.b
	b.WriteString("\n## Gated pods: handing the lock to the next pod\n\n")
	fmt.Fprintf(b, "On a control plane of its own, started for this section with gated pods on (the pod webhook, the admission policies, the manager under its own ServiceAccount), since those would change the rows above. "+
		"Batches of %d gated pods of one lock are queued; %s after a watch of the pods sees one's gate lifted, its status phase is patched to Succeeded, as a kubelet would write it (none runs here). "+
		"From this process's clock: a pod *finished* when that patch answered, its permit *freed* when a watch of the namespace's permits saw it deleted, the next pod *admitted* at the pod watch's first event without the gate `%s`. "+
		"The baseline is the wake-up rows' handoff through the route (a release's answer to the next waiter's acquired answer, %d waiters woken by `waitSeconds`), taken in turns with the batches on the same control plane. "+
		"The section took %s, its control plane's start included.\n\n",
		gatedBatch, gatedHold, gatedpod.Gate, 8, took.Round(time.Second))
	b.WriteString(gatedTable(gaps))
	fmt.Fprintf(b, "\n%s\n\n%s\n", gatedVerdict(gaps), calls)
	return nil
}
