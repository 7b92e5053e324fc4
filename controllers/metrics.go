package controllers

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

var expirations = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "queen_locks_expirations_total",
	Help: "Permits the controller deleted because their lifetime ended without a renew.",
}, []string{"namespace"})

// followedFrom is the running tracker, for the gauge.
var followedFrom atomic.Pointer[Pods]

// graceFrom is the grace of this process's expiry controller, for the
// gauge of overdue permits.
var graceFrom atomic.Pointer[time.Duration]

var heldDesc = prometheus.NewDesc("queen_locks_permits_held",
	"Permits held now (not expired), per namespace, as the manager's cache sees them.",
	[]string{"namespace"}, nil)

var overdueDesc = prometheus.NewDesc("queen_locks_permits_overdue",
	"Permits past their expireTime plus the expiry grace that are still there, per namespace (0 for a namespace with permits and none overdue), "+
		"as the manager's cache sees them: the controller should have deleted them. Above 0 for long: expiry is not running (no leader) or its deletes fail.",
	[]string{"namespace"}, nil)

var namedDesc = prometheus.NewDesc("queen_locks_holder_pods_named",
	"Pods that permits not being deleted name as their holder (spec.holderPod), as the manager's cache sees them: "+
		"what queen_locks_holder_pods_followed comes to on the leader once it has caught up.",
	nil, nil)

var releases = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "queen_locks_releases_total",
	Help: "Permits the controller freed before their lifetime ended, by reason (pod-gone: the holder's pod was deleted, replaced or finished).",
}, []string{"namespace", "reason"})

var followedPods = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
	Name: "queen_locks_holder_pods_followed",
	Help: "Pods the leader follows because a permit names them as its holder.",
}, func() float64 {
	if p := followedFrom.Load(); p != nil {
		return float64(p.Followed())
	}
	return 0
})

var watchedNamespaces = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
	Name: "queen_locks_holder_pod_namespaces_watched",
	Help: "Namespaces whose pods the leader watches because some permit's holder pod lives there: one kube-apiserver watch each.",
}, func() float64 {
	if p := followedFrom.Load(); p != nil {
		return float64(p.Watched())
	}
	return 0
})

var holderPodErrors = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "queen_locks_holder_pod_errors_total",
	Help: "Lists and watches of the pods of a namespace with holder pods, and reads of one holder pod, that failed; the leader tries again with a backoff. While they fail, a gone pod's permit may not be freed.",
})

// The ends of a holding, the end label of queen_locks_hold_seconds.
const (
	// EndReleased: the permit was deleted by its holder (a release) or by
	// hand, by anyone but the controller.
	EndReleased = "released"
	// EndExpired: the controller deleted the permit past its expireTime.
	EndExpired = "expired"
	// EndPodGone: the controller deleted the permit because its holder pod
	// was gone or finished.
	EndPodGone = "pod-gone"
	// EndTakenOver: the permit expired and was acquired again (an update
	// that restamped acquireTime) before the controller deleted it; the
	// new holding is counted when it ends.
	EndTakenOver = "taken-over"
)

// holdBuckets span a short job's lock to a gated pod's day-long run.
var holdBuckets = []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 43200, 86400, 604800}

var holdTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name: "queen_locks_hold_seconds",
	Help: "How long permits were held, from acquireTime to the end of the holding, by namespace and end: " +
		"released (deleted by anyone but the controller: its holder, by hand; to when the leader saw the delete), " +
		"pod-gone (freed by the controller, its holder pod gone; to when the leader saw the delete), " +
		"expired (deleted by the controller; to its last expireTime), " +
		"taken-over (expired and acquired again before the controller deleted it; to its last expireTime). Observed by the leader.",
	Buckets: holdBuckets,
}, []string{"namespace", "end"})

func init() {
	metrics.Registry.MustRegister(expirations, releases, followedPods, watchedNamespaces, holderPodErrors, holdTime)
}

// HeldCollector counts permits from the informer cache at each scrape, so
// the figures are never counters that drift from the objects: held permits
// and overdue ones per namespace, and the pods permits name as holders.
type HeldCollector struct {
	Reader client.Reader
	Clock  clock.PassiveClock
	// Grace is how long past expireTime a permit may stay before it is
	// overdue. Zero takes the grace of this process's expiry controller,
	// or DefaultGrace when it runs none.
	Grace time.Duration
}

// Describe implements prometheus.Collector.
func (c *HeldCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- heldDesc
	ch <- overdueDesc
	ch <- namedDesc
}

func (c *HeldCollector) grace() time.Duration {
	if c.Grace != 0 {
		return c.Grace
	}
	if g := graceFrom.Load(); g != nil {
		return *g
	}
	return DefaultGrace
}

// Collect implements prometheus.Collector.
func (c *HeldCollector) Collect(ch chan<- prometheus.Metric) {
	var list locksv1alpha1.QueenLockList
	if err := c.Reader.List(context.Background(), &list); err != nil {
		ch <- prometheus.NewInvalidMetric(heldDesc, err)
		ch <- prometheus.NewInvalidMetric(overdueDesc, err)
		ch <- prometheus.NewInvalidMetric(namedDesc, err)
		return
	}
	now := c.Clock.Now()
	grace := c.grace()
	held, overdue := map[string]int{}, map[string]int{}
	pods := map[podKey]bool{}
	for i := range list.Items {
		p := &list.Items[i]
		if !permit.Expired(p, now) {
			held[p.Namespace]++
		}
		if !p.DeletionTimestamp.IsZero() {
			continue // released; it goes in a moment
		}
		n := overdue[p.Namespace] // a namespace with permits has the series, at 0 too
		if p.Spec.ExpireTime != nil && now.After(p.Spec.ExpireTime.Add(grace)) {
			n++
		}
		overdue[p.Namespace] = n
		if hp := p.Spec.HolderPod; hp != nil {
			pods[podKeyOf(p.Namespace, hp)] = true
		}
	}
	for ns, n := range held {
		ch <- prometheus.MustNewConstMetric(heldDesc, prometheus.GaugeValue, float64(n), ns)
	}
	for ns, n := range overdue {
		ch <- prometheus.MustNewConstMetric(overdueDesc, prometheus.GaugeValue, float64(n), ns)
	}
	ch <- prometheus.MustNewConstMetric(namedDesc, prometheus.GaugeValue, float64(len(pods)))
}

// holdEnds observes queen_locks_hold_seconds from the leader's informer:
// every delete of a permit ends a holding, and so does a takeover (an
// update that restamps acquireTime). The controller tells which deletes
// are its own (expiry, pod-gone) before it sends them; any other delete
// is a release.
type holdEnds struct {
	clock clock.PassiveClock
	mu    sync.Mutex
	own   map[types.UID]*ownDelete
}

// ownDelete is the controller's deletes of one permit: usually one, but a
// permit can be reconciled again before the informer shows it gone, and
// the second delete then answers not found after the first succeeded.
type ownDelete struct {
	end  string
	sent time.Time
	// calls is how many deletes have not answered yet; ok that one of
	// them succeeded.
	calls int
	ok    bool
	// seen is the permit's last state, when the informer saw the delete
	// before the calls answered.
	seen *locksv1alpha1.QueenLock
}

func newHoldEnds(c clock.PassiveClock) *holdEnds {
	return &holdEnds{clock: c, own: map[types.UID]*ownDelete{}}
}

// forget is how long an own delete the informer never reported is kept.
const forget = 5 * time.Minute

// deleting records that the controller is about to delete p, for end.
func (h *holdEnds) deleting(p *locksv1alpha1.QueenLock, end string) {
	if h == nil {
		return
	}
	now := h.clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	for uid, d := range h.own {
		if now.Sub(d.sent) > forget {
			delete(h.own, uid)
		}
	}
	d := h.own[p.UID]
	if d == nil {
		d = &ownDelete{end: end}
		h.own[p.UID] = d
	}
	d.sent = now
	d.calls++
}

// deleted records how one of the controller's deletes of p answered. Once
// all have answered: if none succeeded, the holding did not end by the
// controller (a conflict means the permit changed first, not found that
// somebody deleted it first: a release). (A delete whose answer was lost
// may have been carried out; it then counts as a release: rare, and never
// the other way round.)
func (h *holdEnds) deleted(p *locksv1alpha1.QueenLock, err error) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	d := h.own[p.UID]
	if d == nil {
		return
	}
	d.calls--
	if err == nil {
		d.ok = true
	}
	if d.calls > 0 {
		return
	}
	switch {
	case !d.ok:
		delete(h.own, p.UID)
		if d.seen != nil {
			h.observe(d.seen, EndReleased)
		}
	case d.seen != nil:
		delete(h.own, p.UID)
		h.observe(d.seen, d.end)
	}
	// Otherwise the informer has yet to report the delete: onDelete ends it.
}

// onDelete is the informer's delete of p, with its last state.
func (h *holdEnds) onDelete(p *locksv1alpha1.QueenLock) {
	h.mu.Lock()
	defer h.mu.Unlock()
	d := h.own[p.UID]
	switch {
	case d == nil:
		h.observe(p, EndReleased)
	case d.ok && d.calls == 0:
		delete(h.own, p.UID)
		h.observe(p, d.end)
	default:
		d.seen = p // the controller's calls have not all answered: they decide
	}
}

// onUpdate is the informer's update of a permit: a new acquireTime on the
// same object is a takeover, which ends the old holding. (An object of
// another UID under the same name means the informer missed a delete;
// nobody can tell how that holding ended, so it is not counted.)
func (h *holdEnds) onUpdate(old, cur *locksv1alpha1.QueenLock) {
	if old.UID != cur.UID || old.Spec.AcquireTime == nil || cur.Spec.AcquireTime == nil ||
		old.Spec.AcquireTime.Equal(cur.Spec.AcquireTime) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.observe(old, EndTakenOver)
}

// observe records the holding p ended with end: a holding that expired
// ended at its expireTime, any other when it was seen to end.
func (h *holdEnds) observe(p *locksv1alpha1.QueenLock, end string) {
	if p.Spec.AcquireTime == nil {
		return
	}
	stop := h.clock.Now()
	if (end == EndExpired || end == EndTakenOver) && p.Spec.ExpireTime != nil {
		stop = p.Spec.ExpireTime.Time
	}
	holdTime.WithLabelValues(p.Namespace, end).Observe(max(stop.Sub(p.Spec.AcquireTime.Time), 0).Seconds())
}

// handler feeds the informer's events to h. It enqueues nothing: the
// controller's own watch of permits does that.
func (h *holdEnds) handler() handler.TypedEventHandler[*locksv1alpha1.QueenLock, reconcile.Request] {
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	return handler.TypedFuncs[*locksv1alpha1.QueenLock, reconcile.Request]{
		UpdateFunc: func(_ context.Context, e event.TypedUpdateEvent[*locksv1alpha1.QueenLock], _ queue) {
			h.onUpdate(e.ObjectOld, e.ObjectNew)
		},
		DeleteFunc: func(_ context.Context, e event.TypedDeleteEvent[*locksv1alpha1.QueenLock], _ queue) {
			h.onDelete(e.Object)
		},
	}
}
