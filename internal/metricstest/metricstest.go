// Package metricstest reads one series from the manager's metrics registry,
// for the tests of the packages that export metrics.
package metricstest

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Series is the series of the metric name whose labels are exactly labels,
// or nil when there is none yet.
func Series(t testing.TB, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue series
				}
			}
			return m
		}
	}
	return nil
}
