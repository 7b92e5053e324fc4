package main

import (
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/queen-locks/queen-locks/test/internal/promtext"
)

// testdata/apiserver-metrics.txt is an excerpt of kube-apiserver v1.37's
// /metrics, scraped by bench -save-metrics after a short run.
func TestTallyOfCapturedMetrics(t *testing.T) {
	f, err := os.Open("testdata/apiserver-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	samples, err := promtext.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	got := tallyOf(samples)
	want := tally{
		// Codes are summed (POST 201 and 409); watches and requests that
		// name no resource (/healthz) are left out; a subresource is kept
		// apart from its resource.
		api: map[string]float64{
			"LIST queenlocks":                      20,
			"DELETE queenlocks":                    18,
			"GET queenlocks":                       27,
			"PATCH queenlocks":                     9,
			"POST queenlocks":                      36,
			"POST tokenreviews":                    2,
			"POST subjectaccessreviews":            37,
			"PUT customresourcedefinitions/status": 2,
			"PUT leases":                           2,
			"POST leases":                          1,
			"DELETE leases":                        1,
			"GET leases":                           1,
		},
		webhooks: map[string]float64{
			"CREATE mqueenlock.locks.queen.dev": 36,
			"UPDATE mqueenlock.locks.queen.dev": 9,
		},
	}
	if d := cmp.Diff(want.api, got.api); d != "" {
		t.Errorf("API calls (-want +got):\n%s", d)
	}
	if d := cmp.Diff(want.webhooks, got.webhooks); d != "" {
		t.Errorf("webhook calls (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]float64{"POST tokenreviews": 2, "POST subjectaccessreviews": 37}, got.split(reviewResources)); d != "" {
		t.Errorf("reviews (-want +got):\n%s", d)
	}
	if o := got.other(); o != 7 {
		t.Errorf("other calls: %v, want 7 (leases and the CRD's status)", o)
	}
}

func TestTallyMinus(t *testing.T) {
	before := tally{api: map[string]float64{"POST queenlocks": 10, "GET queenlocks": 4, "PUT leases": 2}, webhooks: map[string]float64{"CREATE w": 10}}
	after := tally{api: map[string]float64{"POST queenlocks": 50, "GET queenlocks": 4, "PUT leases": 3, "DELETE queenlocks": 40}, webhooks: map[string]float64{"CREATE w": 50}}
	d := after.minus(before)
	want := map[string]float64{"POST queenlocks": 40, "PUT leases": 1, "DELETE queenlocks": 40}
	if diff := cmp.Diff(want, d.api); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if got := breakdown(d.split(lockResources), 40, true); got != "DELETE 1, POST 1" {
		t.Errorf("breakdown %q", got)
	}
	if got := breakdown(d.webhooks, 40, false); got != "CREATE w 1" {
		t.Errorf("webhook breakdown %q", got)
	}
	if got := breakdown(nil, 40, false); got != "none" {
		t.Errorf("empty breakdown %q", got)
	}
}

func TestPerOp(t *testing.T) {
	for _, c := range []struct {
		v    float64
		n    int
		want string
	}{{40, 40, "1"}, {80, 40, "2"}, {1, 40, "0.03"}, {0, 40, "0"}, {41, 40, "1.02"}} {
		if got := perOp(c.v, c.n); got != c.want {
			t.Errorf("perOp(%v, %d) = %q, want %q", c.v, c.n, got, c.want)
		}
	}
}
