package controllers

import (
	"context"

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

var heldDesc = prometheus.NewDesc("queen_locks_permits_held",
	"Permits held now (not expired), per namespace, as the manager's cache sees them.",
	[]string{"namespace"}, nil)

func init() {
	metrics.Registry.MustRegister(expirations)
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
