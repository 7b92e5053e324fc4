package controller

import (
	"context"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

var expirations = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "queen_locks_expirations_total",
	Help: "Permits the controller deleted because their lifetime ended without a renew.",
}, []string{"namespace"})

// followedFrom is the running tracker, for the gauge.
var followedFrom atomic.Pointer[Pods]

var heldDesc = prometheus.NewDesc("queen_locks_permits_held",
	"Permits held now (not expired), per namespace, as the manager's cache sees them.",
	[]string{"namespace"}, nil)

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

func init() {
	metrics.Registry.MustRegister(expirations, releases, followedPods)
}

// HeldCollector counts held permits from the informer cache at each scrape,
// so the figure is never a counter that drifts from the objects.
type HeldCollector struct {
	Reader client.Reader
	Clock  clock.PassiveClock
}

// Describe implements prometheus.Collector.
func (c *HeldCollector) Describe(ch chan<- *prometheus.Desc) { ch <- heldDesc }

// Collect implements prometheus.Collector.
func (c *HeldCollector) Collect(ch chan<- prometheus.Metric) {
	var list locksv1alpha1.QueenLockList
	if err := c.Reader.List(context.Background(), &list); err != nil {
		ch <- prometheus.NewInvalidMetric(heldDesc, err)
		return
	}
	now := c.Clock.Now()
	held := map[string]int{}
	for i := range list.Items {
		if !permit.Expired(&list.Items[i], now) {
			held[list.Items[i].Namespace]++
		}
	}
	for ns, n := range held {
		ch <- prometheus.MustNewConstMetric(heldDesc, prometheus.GaugeValue, float64(n), ns)
	}
}
