package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/permit/gatedpod"
)

// Gated pods (a pod labelled locks.queen.dev/gate waits for its lock
// before it runs; docs/gated-pods.md) as holders: a RoleGated client creates
// Pod objects labelled locks.queen.dev/gate for the run's lock and for its
// semaphore, and stands in for their containers (no kubelet runs here):
// when its watch shows a pod let in (the gate lifted, the token set), the
// pod holds; after a short random hold the client marks the pod Succeeded
// or Failed, or deletes it. Each hold is recorded (Hold) from the watch's
// sighting of the gate's removal to the moment the client decided to end
// it, taken before the write that ends it is sent: the manager frees the
// permit only after it has seen that write, so the recorded hold lies
// inside the permit's life. The checks (gated_check.go) put the holds
// beside the route's holders: never more than the limit at once, tokens
// going up in each slot, no permit freed before its pod ended.
//
// With gated clients in the run, the manager replicas run with
// --gated-pods as the manager's ServiceAccount (the admission policies
// know the manager by that name), and the API server has the pod
// webhook configuration, the admission policies and the manager's pod
// rights of config/gate.

// RoleGated creates gated pods and ends them once let in.
const RoleGated = "gated"

// Kinds of a gated client's operations on its pods.
const (
	KindPodCreate = "pod-create"
	// KindPodFinish sets the pod's phase to Succeeded or Failed, as the
	// kubelet would when its containers end.
	KindPodFinish = "pod-finish"
	KindPodDelete = "pod-delete"
)

// Outcomes of the gated clients' pod operations (besides Deleted, Failed,
// Refused and Unknown).
const (
	Created  = "created"
	Finished = "finished"
)

// How a hold ended.
const (
	EndSucceeded = "succeeded"
	EndFailed    = "failed"
	EndDeleted   = "deleted"
	// EndGone: the pod was gone before the client ended it. Nobody else
	// deletes the gated pods (they have no ttl), so this is not expected;
	// its end is only when the watch saw it go.
	EndGone = "gone"
)

// gatedClientLabel names the client a gated pod belongs to: each client
// watches its own.
const gatedClientLabel = "chaos.queen.dev/client"

// gatedInFlight is how many pods a gated client keeps waiting or holding.
const gatedInFlight = 3

// gatedOwner is the owner the manager acquires for a gated pod.
func gatedOwner(uid string) string { return "pod:" + uid }

// Hold is one gated pod's hold of its lock, as its client saw it.
type Hold struct {
	Client int    `json:"client"`
	Pod    string `json:"pod"`
	UID    string `json:"uid"`
	Lock   string `json:"lock"` // the lock's name (Lock or Semaphore)
	Slot   int    `json:"slot"`
	// Token is the token annotation the gate's removal came with; 0 for a
	// pod that was let in without one (it must never be).
	Token uint64 `json:"token"`
	// Start is when the client's watch showed the gate removed; End when
	// the client decided to end the hold, before it sent the write that
	// does. A pod the client chose to delete while it still looked gated
	// (the line let it in meanwhile) has an End before its Start: an empty
	// hold.
	Start int64  `json:"start"`
	End   int64  `json:"end"`
	How   string `json:"how"`
	// Shape is the pod's shape (gated_shapes.go), empty for a plain one;
	// Limit the limit it asked, 0 when unknown.
	Shape string `json:"shape,omitempty"`
	Limit int    `json:"limit,omitempty"`
}

func (x Hold) String() string {
	return fmt.Sprintf("gated pod %s (owner %s) of %s slot %d token %d held %s .. %s (%s)", x.Pod, gatedOwner(x.UID), x.Lock, x.Slot, x.Token, stamp(x.Start), stamp(x.End), x.How)
}

// holdLine is how a client writes a hold on its stdout, among its Ops.
type holdLine struct {
	Hold *Hold `json:"hold"`
}

// holdOf reads a hold from a client's output line; false for an Op's.
func holdOf(line []byte) (Hold, bool) {
	var l holdLine
	if json.Unmarshal(line, &l) != nil || l.Hold == nil {
		return Hold{}, false
	}
	return *l.Hold, true
}

// podLine is how a gated client writes what it saw of a pod (PodInfo).
type podLine struct {
	Pod *PodInfo `json:"pod"`
}

// podOf reads a pod's record from a client's output line.
func podOf(line []byte) (PodInfo, bool) {
	var l podLine
	if json.Unmarshal(line, &l) != nil || l.Pod == nil {
		return PodInfo{}, false
	}
	return *l.Pod, true
}

func (r *recorder) hold(x Hold) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.holds = append(r.holds, x)
}

// ManagerLease is the manager's leader election Lease (in the run's
// namespace, where the replicas elect): the leader runs the gate.
const ManagerLease = "queen-locks-expiry.locks.queen.dev"

// The manager's leader election timing (controller-runtime's defaults,
// which the manager keeps): a leader renews every RetryPeriod, and a
// candidate takes over a lease not renewed for LeaseDuration.
const (
	ManagerLeaseDuration = 15 * time.Second
	ManagerRetryPeriod   = 2 * time.Second
)

// gatedOn tells whether the run has gated clients.
func gatedOn(cfg Config) bool { return slices.Contains(cfg.Roles, RoleGated) }

// managerUser is the manager's ServiceAccount as a user name, which the
// gated pods' admission policies trust.
var managerUser = "system:serviceaccount:" + controlplane.ManagerNamespace + ":" + controlplane.ManagerServiceAccount

// asManager makes a replica's kubeconfig act as the manager's
// ServiceAccount (impersonated by the admin), as the chart runs it.
func asManager(kc *clientcmdapi.Config) {
	for _, a := range kc.AuthInfos {
		a.Impersonate = managerUser
	}
}

// prepareGated gives the manager its ServiceAccount and rights (those of
// config/rbac, config/gate's pod rights that controlplane.Start applied,
// and leader election in the run's namespace, where the replicas elect),
// and the gated clients theirs: pods in the namespace, and a
// ServiceAccount for the pods that may hold locks there.
func (c *cluster) prepareGated(ctx context.Context, cfg Config) error {
	if !gatedOn(cfg) {
		return nil
	}
	if _, err := controlplane.AsManagerServiceAccount(c.env); err != nil {
		return fmt.Errorf("the manager's ServiceAccount: %w", err)
	}
	const election = "queen-locks-leader-election"
	const pods = "chaos-gated-pods"
	objs := []struct {
		create func() error
		name   string
	}{
		{func() error {
			_, err := c.cs.RbacV1().Roles(Namespace).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: election},
				Rules: []rbacv1.PolicyRule{
					{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
					{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
				}}, metav1.CreateOptions{})
			return err
		}, "the leader election Role"},
		{func() error {
			_, err := c.cs.RbacV1().RoleBindings(Namespace).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: election},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: election},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: controlplane.ManagerNamespace, Name: controlplane.ManagerServiceAccount}},
			}, metav1.CreateOptions{})
			return err
		}, "the leader election RoleBinding"},
		{func() error {
			_, err := c.cs.RbacV1().Roles(Namespace).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: pods},
				Rules: []rbacv1.PolicyRule{
					{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "create", "delete", "patch"}},
					{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"get", "patch", "update"}},
				}}, metav1.CreateOptions{})
			return err
		}, "the gated clients' Role"},
		{func() error {
			_, err := c.cs.RbacV1().RoleBindings(Namespace).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: pods},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: pods},
				Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: ClientUser}},
			}, metav1.CreateOptions{})
			return err
		}, "the gated clients' RoleBinding"},
		{func() error {
			// The gated pods run as it; grantClients let it hold locks here.
			_, err := c.cs.CoreV1().ServiceAccounts(Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: ClientUser}}, metav1.CreateOptions{})
			return err
		}, "the gated pods' ServiceAccount"},
	}
	for _, o := range objs {
		if err := o.create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %s: %w", o.name, err)
		}
	}
	return nil
}

// gatedPod is what a gated client knows of one of its pods.
type gatedPod struct {
	name, uid, lock string
	shape           string
	limit           int
	created         time.Time
	letIn           bool // the watch showed the gate removed
	start           int64
	token           uint64
	slot            int
	end             int64 // when the client chose to end it; 0 before
	notAdmitted     bool  // the watch showed its Admitted condition False
	how             string
	recorded        bool // its hold was written
	gone            bool // deleted, as the watch showed (or never created)
}

// gatedRun is one gated client at work.
type gatedRun struct {
	c      *Client
	ctx    context.Context // of the client's writes
	mu     sync.Mutex
	rnd    *rand.Rand
	pods   map[string]*gatedPod
	seq    int
	ending chan struct{} // closed when the client stops: holds end at once
}

func (g *gatedRun) intN(n int) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.rnd.IntN(n)
}

func (g *gatedRun) sleep(minMS, maxMS int) {
	time.Sleep(time.Duration(minMS+g.intN(maxMS-minMS+1)) * time.Millisecond)
}

// opLock is Op.Lock for lock: empty for the run's main lock.
func opLock(lock string) string {
	if lock == Lock {
		return ""
	}
	return lock
}

// runGated keeps gatedInFlight pods waiting or holding, for the lock or
// the semaphore at random; now and then it deletes a pod that has waited
// more than 10 s (it leaves the line, or is let in as it goes). The
// route's holders contend hard, so a pod often waits that long. When
// stopped, it ends every hold, deletes every pod it made and waits until
// the watch shows them gone (drain).
func (c *Client) runGated(ctx context.Context, stopped func() bool) {
	g := &gatedRun{c: c, ctx: ctx, rnd: rand.New(rand.NewPCG(c.Rand.Uint64(), c.Rand.Uint64())), pods: map[string]*gatedPod{}, ending: make(chan struct{})}
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	synced := make(chan struct{})
	go func() { defer close(watched); g.watch(wctx, synced) }()
	defer func() { stopWatch(); <-watched }()
	<-synced
	for !stopped() {
		var waiting []*gatedPod
		inFlight := 0
		g.mu.Lock()
		for _, p := range g.pods {
			if p.gone || p.end != 0 {
				continue
			}
			inFlight++
			if !p.letIn && time.Since(p.created) > 10*time.Second {
				waiting = append(waiting, p)
			}
		}
		g.mu.Unlock()
		switch {
		case len(waiting) > 0 && g.intN(15) == 0:
			go g.end(ctx, waiting[g.intN(len(waiting))], EndDeleted)
		case inFlight < gatedInFlight:
			g.create(ctx)
		}
		g.sleep(100, 500)
	}
	close(g.ending)
	g.drain(ctx)
}

// create makes one gated pod, again with the same name while the answer
// is unknown.
func (g *gatedRun) create(ctx context.Context) {
	c := g.c
	g.mu.Lock()
	g.seq++
	lock := Lock
	if g.rnd.IntN(2) == 0 {
		lock = Semaphore
	}
	shape := shapes[g.rnd.IntN(len(shapes))]
	p := &gatedPod{name: fmt.Sprintf("g%d-%d", c.ID, g.seq), lock: lock, shape: shape, created: time.Now()}
	g.pods[p.name] = p
	g.mu.Unlock()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: p.name,
			Labels:      map[string]string{gatedpod.Label: gatedpod.LabelValue, gatedClientLabel: strconv.Itoa(c.ID)},
			Annotations: map[string]string{gatedpod.LockAnnotation: lock}},
		Spec: corev1.PodSpec{ServiceAccountName: ClientUser, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "job", Image: "chaos-job"}}},
	}
	limit := shapePod(pod, lock, shape)
	g.mu.Lock()
	p.limit = limit
	g.mu.Unlock()
	for try := 0; ; try++ {
		op := Op{Client: c.ID, Role: RoleGated, Lock: opLock(lock), Kind: KindPodCreate, Owner: p.name, Call: time.Now().UnixNano()}
		_, err := c.Kube.CoreV1().Pods(c.Namespace).Create(ctx, pod, metav1.CreateOptions{})
		op.Return = time.Now().UnixNano()
		op.Outcome = Created
		if err != nil {
			op.Outcome, op.Error = podOutcome(err), err.Error()
			if try > 0 && apierrors.IsAlreadyExists(err) {
				op.Outcome = Created // an earlier try, whose answer was lost, made it
			}
		}
		c.Log(op)
		switch op.Outcome {
		case Created:
			if shape == ShapeUnadmittable {
				g.overflow(ctx, p)
			}
			return
		case Unknown:
			if try < 5 {
				time.Sleep(200 * time.Millisecond)
				continue
			}
			return // the watch tells whether it exists; drain deletes it either way
		default:
			// Certainly not made: the webhook was down or cut off, or
			// refused it.
			g.mu.Lock()
			p.gone = true
			g.mu.Unlock()
			return
		}
	}
}

// KindPodOverflow is the patch that gives a ShapeUnadmittable pod more
// annotations than the manager's policy compares, and lifts its own gate.
const KindPodOverflow = "pod-overflow"

// Patched is a pod patch stored.
const Patched = "patched"

// overflow patches a ShapeUnadmittable pod (gated_shapes.go), again while
// the answer is unknown.
func (g *gatedRun) overflow(ctx context.Context, p *gatedPod) {
	body := overflowPatch()
	for try := 0; try < 10; try++ {
		op := Op{Client: g.c.ID, Role: RoleGated, Lock: opLock(p.lock), Kind: KindPodOverflow, Owner: p.name, Call: time.Now().UnixNano()}
		_, err := g.c.Kube.CoreV1().Pods(g.c.Namespace).Patch(ctx, p.name, types.MergePatchType, body, metav1.PatchOptions{})
		op.Return = time.Now().UnixNano()
		op.Outcome = Patched
		if err != nil {
			op.Outcome, op.Error = podOutcome(err), err.Error()
			if len(op.Error) > 300 {
				op.Error = op.Error[:300]
			}
		}
		g.c.Log(op)
		if err == nil || apierrors.IsNotFound(err) || op.Outcome == Refused {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// podOutcome sorts the error of a gated client's pod operation.
func podOutcome(err error) string {
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) ||
		errors.Is(err, syscall.ECONNREFUSED) || apierrors.IsServiceUnavailable(err):
		return Failed
	case apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) ||
		strings.Contains(err.Error(), "denied the request"):
		// Refused by the pod webhook (say, when it could not ask whether
		// the pod's ServiceAccount may hold locks), an admission policy or
		// RBAC (a restarted API server's, before its caches fill): nothing
		// was stored.
		return Refused
	case strings.Contains(err.Error(), "failed calling webhook"):
		return Failed
	}
	return Unknown
}

// watch follows the client's pods from the list it starts with, closing
// synced once listed. A broken watch is opened again from the last version
// it delivered (the API server runs without a watch cache and etcd
// without compaction, so nothing is skipped); one refused as too old
// lists again.
func (g *gatedRun) watch(ctx context.Context, synced chan struct{}) {
	c := g.c
	sel := labels.Set{gatedpod.Label: gatedpod.LabelValue, gatedClientLabel: strconv.Itoa(c.ID)}.String()
	rv := ""
	once := sync.Once{}
	for ctx.Err() == nil {
		if rv == "" {
			l, err := c.Kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
			if err != nil {
				time.Sleep(200 * time.Millisecond)
				continue
			}
			g.relisted(l.Items)
			rv = l.ResourceVersion
			once.Do(func() { close(synced) })
		}
		w, err := c.Kube.CoreV1().Pods(c.Namespace).Watch(ctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: rv})
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				if st := apierrors.FromObject(ev.Object); apierrors.IsResourceExpired(st) || apierrors.IsGone(st) {
					fmt.Fprintf(os.Stderr, "gated client %d: watch from %s refused (%v); listing again\n", c.ID, rv, st)
					rv = ""
				}
				break
			}
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			g.observe(pod, ev.Type == watch.Deleted)
			rv = pod.ResourceVersion
		}
		w.Stop()
	}
}

// relisted takes in a fresh list: pods missing from it are gone.
func (g *gatedRun) relisted(items []corev1.Pod) {
	listed := map[string]bool{}
	for i := range items {
		listed[items[i].Name] = true
		g.observe(&items[i], false)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for name, p := range g.pods {
		if !listed[name] && p.uid != "" && !p.gone {
			p.gone = true
			g.c.logPod(PodInfo{UID: p.uid, Gone: time.Now().UnixNano()})
			g.goneLocked(p)
		}
	}
}

// observe takes in one version of a pod: its gate's removal starts its
// hold, and a pod seen deleted is gone.
func (g *gatedRun) observe(pod *corev1.Pod, deleted bool) {
	now := time.Now().UnixNano()
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.pods[pod.Name]
	if p == nil {
		// Made by a create whose answer was lost.
		p = &gatedPod{name: pod.Name, lock: pod.Annotations[gatedpod.LockAnnotation], created: pod.CreationTimestamp.Time}
		g.pods[p.name] = p
	}
	if p.uid == "" {
		p.uid = string(pod.UID)
		limit := p.limit
		if limit == 0 {
			limit, _ = strconv.Atoi(pod.Annotations[gatedpod.LimitAnnotation])
			limit = max(limit, 1)
		}
		g.c.logPod(PodInfo{UID: p.uid, Name: p.name, Lock: p.lock, Limit: limit, Shape: p.shape,
			QueuedAt: gatedpod.QueuedAtTime(pod).UnixNano()})
	}
	if !p.notAdmitted {
		for _, c := range pod.Status.Conditions {
			if c.Type == notAdmittedCondition && c.Status == corev1.ConditionFalse {
				p.notAdmitted = true
				g.c.logPod(PodInfo{UID: p.uid, NotAdmitted: now, Reason: c.Reason + ": " + c.Message})
			}
		}
	}
	if deleted || pod.DeletionTimestamp != nil {
		g.c.logPod(PodInfo{UID: p.uid, Gone: now})
	}
	if !p.letIn && !gatedpod.Gated(pod) {
		p.letIn, p.start = true, now
		p.token, _ = strconv.ParseUint(pod.Annotations[gatedpod.TokenAnnotation], 10, 64)
		p.slot, _ = strconv.Atoi(pod.Annotations[gatedpod.SlotAnnotation])
		if p.end != 0 {
			g.recordLocked(p) // chosen to be deleted while it still looked gated
		} else if !deleted {
			go g.holdFor(g.ctx, p)
		}
	}
	if deleted && !p.gone {
		p.gone = true
		g.goneLocked(p)
	}
}

// notAdmittedCondition is the pod condition the gate sets False, with
// its reason, on a pod it cannot let in (docs/gated-pods.md).
const notAdmittedCondition corev1.PodConditionType = "locks.queen.dev/Admitted"

// logPod writes what the client saw of a pod, when it can.
func (c *Client) logPod(p PodInfo) {
	if c.LogPod != nil && p.UID != "" {
		c.LogPod(p)
	}
}

// goneLocked ends the hold of a pod that went before the client ended it.
func (g *gatedRun) goneLocked(p *gatedPod) {
	if p.letIn && p.end == 0 {
		p.end, p.how = time.Now().UnixNano(), EndGone
		g.recordLocked(p)
	}
}

func (g *gatedRun) recordLocked(p *gatedPod) {
	if p.recorded || !p.letIn || p.end == 0 {
		return
	}
	p.recorded = true
	g.c.LogHold(Hold{Client: g.c.ID, Pod: p.name, UID: p.uid, Lock: p.lock, Slot: p.slot, Token: p.token, Start: p.start, End: p.end, How: p.how, Shape: p.shape, Limit: p.limit})
}

// holdFor holds a pod let in for a short random time, or until the client
// stops, then ends it: Succeeded most often, sometimes Failed or deleted.
func (g *gatedRun) holdFor(ctx context.Context, p *gatedPod) {
	d := time.Duration(50+g.intN(1450)) * time.Millisecond
	select {
	case <-time.After(d):
	case <-g.ending:
	}
	how := EndSucceeded
	switch n := g.intN(10); {
	case n < 2:
		how = EndFailed
	case n < 5:
		how = EndDeleted
	}
	g.end(ctx, p, how)
}

// end ends a pod's hold (or its wait): the end is taken before the write
// that ends it is sent, which is tried again until it is stored or the pod
// is gone. A pod marked finished is deleted a little later, so that the
// line's pods do not pile up.
func (g *gatedRun) end(ctx context.Context, p *gatedPod, how string) {
	g.mu.Lock()
	if p.end != 0 || p.gone {
		g.mu.Unlock()
		return
	}
	p.end, p.how = time.Now().UnixNano(), how
	g.recordLocked(p)
	g.mu.Unlock()
	if how == EndDeleted {
		g.remove(ctx, p)
		return
	}
	phase := corev1.PodSucceeded
	if how == EndFailed {
		phase = corev1.PodFailed
	}
	body := fmt.Sprintf(`{"status":{"phase":%q}}`, phase)
	for try := 0; try < 50; try++ {
		op := Op{Client: g.c.ID, Role: RoleGated, Lock: opLock(p.lock), Kind: KindPodFinish, Owner: p.name, Call: time.Now().UnixNano()}
		_, err := g.c.Kube.CoreV1().Pods(g.c.Namespace).Patch(ctx, p.name, types.MergePatchType, []byte(body), metav1.PatchOptions{}, "status")
		op.Return = time.Now().UnixNano()
		op.Outcome = Finished
		if err != nil {
			op.Outcome, op.Error = podOutcome(err), err.Error()
		}
		g.c.Log(op)
		if err == nil || apierrors.IsNotFound(err) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	select {
	case <-time.After(time.Duration(1000+g.intN(2000)) * time.Millisecond):
	case <-g.ending:
	}
	g.remove(ctx, p)
}

// remove deletes the pod (its UID as the precondition), again until it is
// gone.
func (g *gatedRun) remove(ctx context.Context, p *gatedPod) {
	for try := 0; try < 50; try++ {
		g.mu.Lock()
		name, uid, gone := p.name, p.uid, p.gone
		g.mu.Unlock()
		if gone {
			return
		}
		op := Op{Client: g.c.ID, Role: RoleGated, Lock: opLock(p.lock), Kind: KindPodDelete, Owner: name, Call: time.Now().UnixNano()}
		opts := metav1.DeleteOptions{}
		if uid != "" {
			u := types.UID(uid)
			opts.Preconditions = &metav1.Preconditions{UID: &u}
		}
		err := g.c.Kube.CoreV1().Pods(g.c.Namespace).Delete(ctx, name, opts)
		op.Return = time.Now().UnixNano()
		op.Outcome = Deleted
		if err != nil {
			op.Outcome, op.Error = podOutcome(err), err.Error()
		}
		g.c.Log(op)
		if apierrors.IsNotFound(err) {
			// Deleted before (an earlier try whose answer was lost), or
			// never made: names are never used twice.
			g.mu.Lock()
			p.gone = true
			g.mu.Unlock()
		}
		if err == nil || apierrors.IsNotFound(err) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// drain ends every hold and deletes every pod the client made, until the
// watch has shown them all gone or 45 s have passed. First it gives the
// pods still waiting up to 10 s to be let in (each is ended at once): the
// route's holders stop too, and on the run's busy lock a pod seldom wins
// before.
func (g *gatedRun) drain(ctx context.Context) {
	for wait := time.Now().Add(10 * time.Second); time.Now().Before(wait); time.Sleep(100 * time.Millisecond) {
		waiting := 0
		g.mu.Lock()
		for _, p := range g.pods {
			if !p.gone && !p.letIn && p.end == 0 {
				waiting++
			}
		}
		g.mu.Unlock()
		if waiting == 0 {
			break
		}
	}
	deadline := time.Now().Add(45 * time.Second)
	var next time.Time
	for ; time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var left []*gatedPod
		g.mu.Lock()
		for _, p := range g.pods {
			if !p.gone {
				left = append(left, p)
			}
		}
		g.mu.Unlock()
		if len(left) == 0 {
			return
		}
		if time.Now().Before(next) {
			continue
		}
		next = time.Now().Add(3 * time.Second)
		for _, p := range left {
			g.mu.Lock()
			waiting, ended := p.end == 0 && !p.letIn, p.end != 0
			g.mu.Unlock()
			switch {
			case waiting:
				go g.end(ctx, p, EndDeleted)
			case ended:
				go g.remove(ctx, p) // again: harmless
			}
			// Let in and not yet ended: its holdFor ends it at once, now
			// that ending is closed, and records the end first.
		}
	}
	fmt.Fprintf(os.Stderr, "gated client %d: pods left after 45 s of draining\n", g.c.ID)
}
