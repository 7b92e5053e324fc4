package main

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// testdata/apiserver-metrics.txt is an excerpt of kube-apiserver v1.37's
// /metrics, scraped by bench -save-metrics after a short run.
func TestTallyOfCapturedMetrics(t *testing.T) {
	f, err := os.Open("testdata/apiserver-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	samples, err := parseMetrics(f)
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

func TestParseLine(t *testing.T) {
	s, err := parseLine(`m{path="/a,b",msg="say \"hi\"\\n",x="1\n2", } 3.5e+02 1700000000000`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"path": "/a,b", "msg": `say "hi"\n`, "x": "1\n2"}
	if s.name != "m" || s.value != 350 {
		t.Errorf("got %s %v", s.name, s.value)
	}
	if d := cmp.Diff(want, s.labels); d != "" {
		t.Errorf("labels (-want +got):\n%s", d)
	}
	if s, err := parseLine("up 1"); err != nil || s.name != "up" || s.value != 1 || len(s.labels) != 0 {
		t.Errorf("no labels: %+v %v", s, err)
	}
	for _, bad := range []struct{ line, says string }{
		{`m{a="1"`, "not closed with }"},
		{`m{a="1} 2`, "not closed with \""},
		{`m{a=1} 2`, `want name="value"`},
		{`m{a="1" b="2"} 2`, "want , or }"},
		{`m{a="\q"} 2`, `unknown escape \q`},
		{`m{a="1"}`, "want a value"},
		{`m{a="1"} two`, `value "two"`},
		{`m{a="1"} 1 2 3`, "at most a timestamp"},
		{`{a="1"} 1`, "no metric name"},
	} {
		_, err := parseLine(bad.line)
		if err == nil || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("%s: error %v, want one saying %q", bad.line, err, bad.says)
		}
	}
	if _, err := parseMetrics(strings.NewReader("# HELP m x\nm 1\nm{ 2\n")); err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("a bad line is named by its number: %v", err)
	}
}
