package route

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/queen-locks/queen-locks/locks"
)

// waitBuckets reach past the longest acquire a call can make: MaxWait (the
// largest waitSeconds) plus the operation's own bound, 20 s by default.
var waitBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 30, 45, 60, 75, 90, 120}

var (
	operations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "queen_locks_route_operations_total",
		Help: "Lock operations the route answered, by op and outcome (acquired, already, held, contended, renewed, lost, released, ok, kv_precondition, answered, error).",
	}, []string{"op", "outcome"})
	operationDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "queen_locks_route_operation_duration_seconds",
		Help:    "Time to carry out one lock operation against the API server, by op (a renew's is the renew latency). Exemplars name the caller.",
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
	acquireWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "queen_locks_route_acquire_wait_seconds",
		Help: "Time from the start of a route call to its answer, once for each acquire it carried, by the lock's namespace, the acquire's outcome " +
			"(acquired, already, held, contended, quota, error) and waited (true when it sent waitSeconds above 0: held is then a wait run out). Exemplars name the caller.",
		Buckets: waitBuckets,
	}, []string{"namespace", "outcome", "waited"})
	losses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "queen_locks_route_losses_total",
		Help: "Holders told they no longer hold their permit, by namespace, op and reason: renews and releases answered lost, checks answered kv_precondition.",
	}, []string{"namespace", "op", "reason"})
)

func init() {
	metrics.Registry.MustRegister(operations, operationDuration, requestDuration, refused, callsInFlight, reviewDuration, acquireWait, losses)
	// Series that alerts divide by exist from the start, at 0: rate() sees
	// no increase in the first sample of a series, so a series born with
	// the first failure would hide that failure from them.
	for _, outcome := range []string{"renewed", locks.ReasonLost, "error"} {
		operations.WithLabelValues(OpRenew, outcome)
	}
	for _, code := range []string{"200", "429", "503"} {
		requestDuration.WithLabelValues(code)
	}
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

// observe records d on obs, with the caller as its exemplar when there is
// one (there is none with --auth=none).
func observe(obs prometheus.Observer, d time.Duration, caller string) {
	if eo, ok := obs.(prometheus.ExemplarObserver); ok && caller != "" {
		eo.ObserveWithExemplar(d.Seconds(), exemplar(caller))
		return
	}
	obs.Observe(d.Seconds())
}

// observeAcquires records, for each acquire of a call, the time from the
// call's start to its answer and how it ended.
func observeAcquires(ns string, caller Caller, ops []Operation, outcomes []string, d time.Duration) {
	for i, op := range ops {
		if op.Op != OpAcquire {
			continue
		}
		waited := "false"
		if op.WaitSeconds > 0 {
			waited = "true"
		}
		observe(acquireWait.WithLabelValues(ns, outcomes[i], waited), d, caller.Username)
	}
}

// countLoss counts an answer that tells a holder it lost its permit.
func countLoss(ns, op, outcome string) {
	switch {
	case (op == OpRenew || op == OpRelease) && outcome == locks.ReasonLost,
		op == OpCheck && outcome == locks.ReasonKVPrecondition:
		losses.WithLabelValues(ns, op, outcome).Inc()
	}
}
