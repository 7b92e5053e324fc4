package main

import (
	"slices"
	"time"

	"github.com/queen-locks/queen-locks/test/internal/promtext"
)

// The pure helpers: kube-apiserver's open watches from its metrics, and
// percentiles.

// longRunning is kube-apiserver's gauge of requests in progress that do
// not end by themselves (watches, and exec, attach, proxy), by verb,
// group, resource, subresource and scope.
const longRunning = "apiserver_longrunning_requests"

// watchesByResource sums kube-apiserver's open watches by resource, over
// groups, scopes and components; "" is watches that name no resource.
func watchesByResource(samples []promtext.Sample) map[string]float64 {
	out := map[string]float64{}
	for _, s := range samples {
		if s.Name == longRunning && s.Labels["verb"] == "WATCH" {
			out[s.Labels["resource"]] += s.Value
		}
	}
	return out
}

// percentile is the p-th percentile of d by nearest rank (p of 100); it
// sorts d. 0 for none.
func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	i := (len(d)*p + 99) / 100 // the ceiling of len*p/100: nearest rank
	return d[min(max(i-1, 0), len(d)-1)]
}
