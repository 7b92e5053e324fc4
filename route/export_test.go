package route

import "github.com/prometheus/client_golang/prometheus"

// OperationsCounter exposes the operations counter to the tests.
func OperationsCounter(op, outcome string) prometheus.Counter {
	return operations.WithLabelValues(op, outcome)
}
