package flood

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"testing"

	"k8s.io/client-go/kubernetes"

	"github.com/queen-locks/queen-locks/test/internal/promtext"
)

// reviews is what kube-apiserver counted of its calls to the manager's
// webhooks: every review it sent, how long each took to be answered, and
// the ones it could not get answered (a timeout, a refused connection, a
// body it could not read), which with failurePolicy Fail refuse the write.
type reviews struct {
	sent      float64
	failed    float64
	within    float64 // answered within the webhooks' timeout
	withinTwo float64 // answered within 2.5 s
}

// The webhooks' timeoutSeconds in config/webhook, and the duration
// histogram buckets of kube-apiserver that bound it and a quick answer.
const (
	reviewTimeoutBucket = "10"
	reviewQuickBucket   = "2.5"
)

// scrapeReviews reads kube-apiserver's own account of its webhook calls.
// The flood reads it before and after and compares the two: the counters
// are the API server's, so a review lost inside the manager (never
// answered, answered late, answered with an error) cannot go unseen.
func scrapeReviews(ctx context.Context, cs kubernetes.Interface) (reviews, error) {
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return reviews{}, fmt.Errorf("reading kube-apiserver's metrics: %w", err)
	}
	samples, err := promtext.Parse(bytes.NewReader(raw),
		"apiserver_admission_webhook_admission_duration_seconds_count",
		"apiserver_admission_webhook_admission_duration_seconds_bucket",
		"apiserver_admission_webhook_rejection_count")
	if err != nil {
		return reviews{}, err
	}
	var r reviews
	for _, s := range samples {
		switch s.Name {
		case "apiserver_admission_webhook_admission_duration_seconds_count":
			r.sent += s.Value
		case "apiserver_admission_webhook_admission_duration_seconds_bucket":
			switch le := s.Labels["le"]; {
			case sameBound(le, reviewTimeoutBucket):
				r.within += s.Value
			case sameBound(le, reviewQuickBucket):
				r.withinTwo += s.Value
			}
		case "apiserver_admission_webhook_rejection_count":
			// A review answered "no" is the webhook's decision; one
			// that never got an answer is not.
			if s.Labels["error_type"] != "no_error" {
				r.failed += s.Value
			}
		}
	}
	return r, nil
}

// sameBound compares a bucket's le label with a bound, whatever digits the
// exposition used ("10" or "10.0").
func sameBound(le, bound string) bool {
	a, errA := strconv.ParseFloat(le, 64)
	b, errB := strconv.ParseFloat(bound, 64)
	return errA == nil && errB == nil && a == b
}

func (r reviews) minus(o reviews) reviews {
	return reviews{sent: r.sent - o.sent, failed: r.failed - o.failed, within: r.within - o.within, withinTwo: r.withinTwo - o.withinTwo}
}

func TestSameBound(t *testing.T) {
	for _, c := range []struct {
		le, bound string
		want      bool
	}{{"10", "10", true}, {"10.0", "10", true}, {"2.5", "2.5", true}, {"25", "2.5", false}, {"+Inf", "10", false}, {"", "10", false}} {
		if got := sameBound(c.le, c.bound); got != c.want {
			t.Errorf("sameBound(%q, %q) = %v, want %v", c.le, c.bound, got, c.want)
		}
	}
}
