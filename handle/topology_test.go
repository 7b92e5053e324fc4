package handle_test

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/locks"
)

// A handle in the chart's topology: the route behind one address that
// spreads calls over two replicas, the pod's projected token, the lock in
// another namespace than the pod. A renew whose answer is lost is retried
// with the same token and reaches the other replica, which carries it
// through: the handle keeps its lock over several lifetimes, its token
// rising, and no loss is reported.
func TestAHandleKeepsItsLockWhenRetriesReachTheOtherReplica(t *testing.T) {
	tp := env.Production(t, controlplane.TopologyOptions{})
	ctx := context.Background()
	c := handle.New(handle.HTTP(tp.URL, handle.HTTPOptions{Namespace: tp.LockNS, TokenFile: tp.TokenFile}))
	// A lifetime long enough that the first calls to fresh replicas (their
	// first reviews of the token) do not eat it.
	h := c.Lock("nightly", 6*time.Second)
	lost := make(chan string, 1)
	h.OnLost(func(r string) { lost <- r })
	if ok, err := h.Acquire(ctx); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	defer func() { _ = h.Release(context.Background()) }()
	// Three times, the answer of one renew is lost after the replica
	// carried it out; the handle's retry, with the same token, reaches the
	// other replica.
	first := h.Token()
	for i := 1; i <= 3; i++ {
		before := h.Token()
		tp.Proxy.DropAnswers(`"op":"renew"`, 1)
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			select {
			case r := <-lost:
				t.Fatalf("the handle reported its lock lost (%s) after a renew whose answer was dropped", r)
			default:
			}
			return tp.Proxy.Dropped() == i && h.Token() > before, nil
		})
		if err != nil {
			t.Fatalf("round %d: %d answers dropped, token %d (was %d): the retry never renewed", i, tp.Proxy.Dropped(), h.Token(), before)
		}
	}
	select {
	case r := <-lost:
		t.Fatalf("the handle reported its lock lost (%s)", r)
	default:
	}
	if h.Token() <= first {
		t.Fatalf("token %d, want above %d", h.Token(), first)
	}
	// The server agrees: the handle's token is the permit's.
	hs, err := locks.New(env.Client, nil).Get(ctx, tp.LockNS, "nightly")
	if err != nil || len(hs) != 1 || hs[0].Token != h.Token() {
		t.Fatalf("holders %+v %v, want the handle's token %d", hs, err, h.Token())
	}
}
