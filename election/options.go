package election

import (
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/guard"
)

// Option adjusts a Lock.
type Option func(*Lock)

// WithEventRecorder records client-go's leader election events ("became
// leader", "stopped leading") on the permit.
func WithEventRecorder(r resourcelock.EventRecorder) Option {
	return func(l *Lock) { l.recorder = r }
}

// WithHolderPod names the pod the candidate runs in, from the downward API
// (POD_NAMESPACE, POD_NAME, POD_UID). The queen-locks controller then frees
// the permit as soon as that pod is gone or finished, so the next leader
// need not wait out the lease. The webhook admits it only from that very
// pod, proven by its pod-bound ServiceAccount token (SPEC section 3). An
// empty name or UID (not in a pod) names none.
func WithHolderPod(namespace, name, uid string) Option {
	return func(l *Lock) {
		if name == "" || uid == "" {
			l.pod = nil
			return
		}
		l.pod = &locksv1alpha1.PodRef{Namespace: namespace, Name: name, UID: uid}
	}
}

// WithGuardOptions are options of the clients Client makes, such as
// guard.Kinds for the kinds the chart's guard.rules enable.
func WithGuardOptions(opts ...guard.Option) Option {
	return func(l *Lock) { l.guardOpts = append(l.guardOpts, opts...) }
}

// WithTimeout bounds each request of the Lock (DefaultTimeout unless the
// rest.Config sets one). Keep it below the RenewDeadline.
func WithTimeout(d time.Duration) Option { return func(l *Lock) { l.timeout = d } }

// WithClock sets the clock the Lock judges a permit's expiry by after a
// refused write. The decisions that count are the API server's.
func WithClock(c clock.PassiveClock) Option { return func(l *Lock) { l.clock = c } }
