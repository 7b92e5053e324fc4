package route

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	operations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "queen_locks_route_operations_total",
		Help: "Lock operations the route answered, by op and outcome (acquired, already, held, contended, renewed, lost, released, ok, kv_precondition, answered, error).",
	}, []string{"op", "outcome"})
	operationDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "queen_locks_route_operation_duration_seconds",
		Help:    "Time to carry out one lock operation against the API server.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
	}, []string{"op"})
	requestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "queen_locks_route_request_duration_seconds",
		Help:    "Time to answer one call of the route, by HTTP status code.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
	}, []string{"code"})
)

func init() {
	metrics.Registry.MustRegister(operations, operationDuration, requestDuration)
}
