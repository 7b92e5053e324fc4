package gate

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/queen-locks/queen-locks/permit/gatedpod"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Labels are the namespace at most: a lock's name is the user's to choose,
// and one series per lock would grow without bound.
var (
	admissions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "queen_locks_gated_pod_admissions_total",
		Help: "Gated pods the manager let in (scheduling gate removed, token set).",
	}, []string{"namespace"})
	admissionSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "queen_locks_gated_pod_admission_seconds",
		Help: "Time from a gated pod's queued-at (its creation) to its admission: how long it waited in line.",
		// From a free lock's sub-second admission to a nightly job that
		// waited hours behind another.
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600},
	}, []string{"namespace"})
	ttlDeletions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "queen_locks_gated_pod_ttl_deletions_total",
		Help: "Gated pods the manager deleted because they held their lock for their whole ttl.",
	}, []string{"namespace"})
	refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "queen_locks_gated_pod_refusals_total",
		Help: "Times a gated pod could not be let in (its acquire or the patch that lifts its gate was refused): it was told why, and the pods behind it went on.",
	}, []string{"namespace"})
)

var waitingDesc = prometheus.NewDesc("queen_locks_gated_pods_waiting",
	"Gated pods waiting at the scheduling gate for their lock, per namespace, as the manager's cache sees them.",
	[]string{"namespace"}, nil)

func init() {
	metrics.Registry.MustRegister(admissions, admissionSeconds, ttlDeletions, refusals)
}

// WaitingCollector counts the waiting gated pods from the cache at each
// scrape, so the figure is always the pods themselves.
type WaitingCollector struct {
	Reader client.Reader
}

// Describe implements prometheus.Collector.
func (c *WaitingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- waitingDesc }

// Collect implements prometheus.Collector.
func (c *WaitingCollector) Collect(ch chan<- prometheus.Metric) {
	var list corev1.PodList
	if err := c.Reader.List(context.Background(), &list, client.MatchingLabels{gatedpod.Label: gatedpod.LabelValue}); err != nil {
		ch <- prometheus.NewInvalidMetric(waitingDesc, err)
		return
	}
	waiting := map[string]int{}
	for i := range list.Items {
		if gatedpod.Gated(&list.Items[i]) && list.Items[i].DeletionTimestamp == nil {
			waiting[list.Items[i].Namespace]++
		}
	}
	for ns, n := range waiting {
		ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(n), ns)
	}
}
