package main

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/queen-locks/queen-locks/test/internal/promtext"
)

// The calls an operation costs are read from kube-apiserver's own counters,
// not from the client: they count what reached the API server, whoever sent
// it (the route, the handle, the webhook's patch), and a call the client
// retried counts twice.
const (
	requestTotal = "apiserver_request_total"
	webhookTotal = "apiserver_admission_webhook_request_total"
)

// tally is what kube-apiserver counted: API requests by "VERB resource"
// (the subresource after a slash), and admission webhook calls by
// "OPERATION webhook". Watches are left out: one is counted when it ends,
// not per event, and the informers' watches end when the API server says.
// So are requests that name no resource (/metrics, discovery, healthz).
type tally struct {
	api, webhooks map[string]float64
}

func tallyOf(samples []promtext.Sample) tally {
	t := tally{api: map[string]float64{}, webhooks: map[string]float64{}}
	for _, s := range samples {
		switch s.Name {
		case requestTotal:
			res, verb := s.Labels["resource"], s.Labels["verb"]
			if res == "" || verb == "WATCH" {
				continue
			}
			if sub := s.Labels["subresource"]; sub != "" {
				res += "/" + sub
			}
			t.api[verb+" "+res] += s.Value
		case webhookTotal:
			t.webhooks[s.Labels["operation"]+" "+s.Labels["name"]] += s.Value
		}
	}
	return t
}

// minus is what was counted between before and t.
func (t tally) minus(before tally) tally {
	d := tally{api: map[string]float64{}, webhooks: map[string]float64{}}
	for _, m := range []struct{ after, before, into map[string]float64 }{
		{t.api, before.api, d.api}, {t.webhooks, before.webhooks, d.webhooks},
	} {
		for k, v := range m.after {
			if dv := v - m.before[k]; dv != 0 {
				m.into[k] = dv
			}
		}
	}
	return d
}

// The resources a lock operation touches: the permits, and with token
// auth the reviews of the caller. Anything else counted in the window is
// the control plane's own background (its leases, endpoints, and so on).
var (
	lockResources   = []string{"queenlocks"}
	reviewResources = []string{"tokenreviews", "subjectaccessreviews"}
)

// split answers the calls on resources, by "VERB resource".
func (t tally) split(resources []string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range t.api {
		if slices.Contains(resources, resourceOf(k)) {
			out[k] = v
		}
	}
	return out
}

// other is the sum of the calls on neither lock nor review resources.
func (t tally) other() float64 {
	var sum float64
	for k, v := range t.api {
		if r := resourceOf(k); !slices.Contains(lockResources, r) && !slices.Contains(reviewResources, r) {
			sum += v
		}
	}
	return sum
}

func resourceOf(key string) string {
	_, res, _ := strings.Cut(key, " ")
	res, _, _ = strings.Cut(res, "/")
	return res
}

func sum(m map[string]float64) float64 {
	var s float64
	for _, v := range m {
		s += v
	}
	return s
}

// perOp writes counts divided by n: "1", or "0.03" when the calls are
// shared among operations (cached reviews).
func perOp(v float64, n int) string {
	x := v / float64(n)
	if math.Abs(x-math.Round(x)) < 0.005 {
		return strconv.Itoa(int(math.Round(x)))
	}
	return strconv.FormatFloat(x, 'f', 2, 64)
}

// breakdown writes each kind of call per operation: "CREATE 1, GET 1".
// With drop set, the resource is left out of each key.
func breakdown(m map[string]float64, n int, dropResource bool) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		label := k
		if dropResource {
			label, _, _ = strings.Cut(k, " ")
		}
		parts = append(parts, label+" "+perOp(m[k], n))
	}
	return strings.Join(parts, ", ")
}

// saveMetrics, when set, receives the text of each scrape (-save-metrics),
// to see what kube-apiserver exposes.
var saveMetrics string

// scrape reads kube-apiserver's /metrics with the admin identity.
func scrape(ctx context.Context, cs kubernetes.Interface) (tally, error) {
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return tally{}, fmt.Errorf("reading kube-apiserver's /metrics: %w", err)
	}
	if saveMetrics != "" {
		if err := os.WriteFile(saveMetrics, raw, 0o644); err != nil {
			return tally{}, err
		}
	}
	samples, err := promtext.Parse(bytes.NewReader(raw))
	if err != nil {
		return tally{}, fmt.Errorf("kube-apiserver's /metrics: %w", err)
	}
	return tallyOf(samples), nil
}

// settledScrape scrapes until two scrapes in a row agree on the lock and
// review calls: kube-apiserver counts a request as its handler returns,
// which can be just after the client has its answer.
func settledScrape(ctx context.Context, cs kubernetes.Interface) (tally, error) {
	prev, err := scrape(ctx, cs)
	if err != nil {
		return tally{}, err
	}
	for range 20 {
		time.Sleep(50 * time.Millisecond)
		cur, err := scrape(ctx, cs)
		if err != nil {
			return tally{}, err
		}
		d := cur.minus(prev)
		if len(d.split(lockResources)) == 0 && len(d.split(reviewResources)) == 0 && len(d.webhooks) == 0 {
			return cur, nil
		}
		prev = cur
	}
	return tally{}, fmt.Errorf("kube-apiserver's lock call counters did not settle within a second")
}
