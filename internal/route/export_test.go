package route

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// OperationsCounter exposes the operations counter to the tests.
func OperationsCounter(op, outcome string) prometheus.Counter {
	return operations.WithLabelValues(op, outcome)
}

// CallsInFlight exposes the gauge of calls in progress to the tests.
var CallsInFlight prometheus.Gauge = callsInFlight

// AuthenticateForTest verifies token as the route does, with a TokenReview
// through cfg, and answers the caller it names.
func AuthenticateForTest(cfg *rest.Config, token string) (Caller, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return Caller{}, err
	}
	v, err := newReviews(cs, nil, time.Second, 10*time.Second)
	if err != nil {
		return Caller{}, err
	}
	r, _ := http.NewRequest(http.MethodPost, Path, nil)
	r.Header.Set("Authorization", "Bearer "+token)
	c, f := v.authenticate(r)
	if f != nil {
		return Caller{}, errorString(f.message)
	}
	return c, nil
}

type errorString string

func (e errorString) Error() string { return string(e) }
