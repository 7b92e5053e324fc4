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
	// Callers are never a label (their number is unbounded); each
	// observation carries its caller as an exemplar instead.
	requestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "queen_locks_route_request_duration_seconds",
		Help:    "Time to answer one call of the route, by HTTP status code. Exemplars name the caller.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
	}, []string{"code"})
	refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "queen_locks_route_refused_total",
		Help: "Calls refused before any operation ran, by reason (no_credentials, invalid_token, forbidden, unavailable, too_many_calls, too_many_calls_of_caller, body_memory).",
	}, []string{"reason"})
	callsInFlight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "queen_locks_route_calls_in_flight",
		Help: "Calls of the route in progress.",
	})
	reviewDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "queen_locks_route_token_review_duration_seconds",
		Help:    "Time of the TokenReviews the route sent (cache misses), by HTTP status code.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
	}, []string{"code"})
)

func init() {
	metrics.Registry.MustRegister(operations, operationDuration, requestDuration, refused, callsInFlight, reviewDuration)
}

// exemplar labels an observation with its caller, cut to the 128 runes
// exemplars may carry.
func exemplar(caller string) prometheus.Labels {
	const max = 128 - len("caller")
	if r := []rune(caller); len(r) > max {
		caller = string(r[:max])
	}
	return prometheus.Labels{"caller": caller}
}
