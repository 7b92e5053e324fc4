package locks_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/locks"
)

// goneDuringCreate is the real API server, with a caller that goes away
// while its create is in flight: the create lands, then the caller's
// context ends before the answer comes back.
type goneDuringCreate struct {
	client.Client
	leave context.CancelFunc
}

func (g *goneDuringCreate) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	err := g.Client.Create(context.WithoutCancel(ctx), obj, opts...)
	g.leave()
	if ctx.Err() != nil {
		return ctx.Err() // the answer never reached a caller whose context ended
	}
	return err
}

// noRoom is a Waker with no room for another waiter, as at the cap.
type noRoom struct{}

func (noRoom) Wait(string, string, int) (locks.Waiter, bool) { return nil, false }

// At the waiter cap a waiting acquire tries once; when its caller goes away
// during that try's create, what the create won is given back, not left
// held until its TTL.
func TestAWaitingAcquireAtTheCapGivesBackWhatItsGoneCallerWon(t *testing.T) {
	ns := namespace(t)
	ctx, cancel := context.WithCancel(context.Background())
	l := locks.New(&goneDuringCreate{Client: env.Client, leave: cancel}, nil)
	_, err := l.Acquire(ctx, ns, "capped", "w", 600, 1, locks.WaitUpTo(10*time.Second, noRoom{}))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire for a caller that went away: %v, want context.Canceled", err)
	}
	hs, err := locks.New(env.Client, nil).Get(context.Background(), ns, "capped")
	if err != nil || len(hs) != 0 {
		t.Fatalf("holders %+v %v: what the gone caller's create won is still held", hs, err)
	}
}
