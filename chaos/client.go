package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// Client is one contender: it loops acquire, guarded write, renew, guarded
// write, release, and logs every call as an Op.
type Client struct {
	ID        int
	Route     handle.Transport // the route, namespace set
	Namespace string
	Lock      string
	Object    string // the guarded ConfigMap
	TTL       int64  // seconds
	Kube      kubernetes.Interface
	Rand      *rand.Rand
	Log       func(Op)

	cycle int
}

// Run loops until stop is closed, finishing the call in hand.
func (c *Client) Run(ctx context.Context, stop <-chan struct{}) {
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	for !stopped() {
		c.cycle++
		owner := ownerName(c.ID, c.cycle)
		token, ok := c.acquire(ctx, owner, stop)
		if !ok {
			c.pause(50, 250)
			continue
		}
		c.pause(0, 300)
		c.write(ctx, owner, token)
		c.pause(0, 300)
		op := c.call(ctx, Op{Kind: KindRenew, Owner: owner, Token: token, TTL: c.TTL})
		if op.Outcome != Renewed {
			continue // lost, or not known: a new cycle with a new owner
		}
		token = op.NewToken
		c.pause(0, 300)
		c.write(ctx, owner, token)
		if c.Rand.IntN(8) == 0 {
			continue // walk away without releasing: the lease must run out
		}
		c.call(ctx, Op{Kind: KindRelease, Owner: owner, Token: token})
	}
}

// acquire tries once, and again with the same owner while the answer is
// unknown (a retry answers "already" if the first one won).
func (c *Client) acquire(ctx context.Context, owner string, stop <-chan struct{}) (uint64, bool) {
	for {
		op := c.call(ctx, Op{Kind: KindAcquire, Owner: owner, TTL: c.TTL})
		switch op.Outcome {
		case Acquired, Already:
			return op.NewToken, true
		case Unknown, Failed:
			select {
			case <-stop:
				return 0, false
			case <-time.After(200 * time.Millisecond):
			}
		default:
			return 0, false
		}
	}
}

func (c *Client) pause(minMS, maxMS int) {
	time.Sleep(time.Duration(minMS+c.Rand.IntN(maxMS-minMS+1)) * time.Millisecond)
}

// call makes one lock operation through the route and logs it.
func (c *Client) call(ctx context.Context, op Op) Op {
	op.Client = c.ID
	op.Call = time.Now().UnixNano()
	err := c.send(ctx, &op)
	op.Return = time.Now().UnixNano()
	var refused *handle.CallError
	switch {
	case errors.As(err, &refused) && refused.Code >= 400 && refused.Code < 500:
		// The route refused the call whole: nothing was applied, and the
		// harness sent something wrong.
		op.Outcome, op.Error, op.BadCall = Failed, err.Error(), true
	case errors.Is(err, syscall.ECONNREFUSED):
		op.Outcome, op.Error = Failed, err.Error() // the manager is down: nothing was sent
	case err != nil:
		op.Outcome, op.Error = Unknown, err.Error()
	}
	c.Log(op)
	return op
}

// send makes op's call through the handle's route transport, the one
// programs use, and records the answer in op.
func (c *Client) send(ctx context.Context, op *Op) error {
	switch op.Kind {
	case KindAcquire:
		a, err := c.Route.Acquire(ctx, c.Lock, op.Owner, op.TTL, 1)
		switch {
		case err != nil:
			return err
		case a.Already:
			op.Outcome = Already
		case a.Acquired:
			op.Outcome = Acquired
		case a.Reason == locks.ReasonHeld:
			op.Outcome = Held
			if len(a.Holders) > 0 {
				h := a.Holders[0]
				op.HolderOwner, op.HolderToken, op.HolderExpires = h.Owner, h.Token, h.ExpiresAt.UnixNano()
			}
		case a.Reason == locks.ReasonContended:
			op.Outcome = Contended
		default:
			return fmt.Errorf("unexpected answer %+v", a)
		}
		if a.Acquired {
			op.NewToken, op.ExpiresAt = a.Permit.Token, a.Permit.ExpiresAt.UnixNano()
		}
	case KindRenew:
		r, err := c.Route.Renew(ctx, c.Lock, 0, op.Token, op.Owner, op.TTL)
		switch {
		case err != nil:
			return err
		case r.Renewed:
			op.Outcome, op.NewToken, op.ExpiresAt = Renewed, r.Permit.Token, r.Permit.ExpiresAt.UnixNano()
		case r.Reason == locks.ReasonLost:
			op.Outcome = Lost
		default:
			return fmt.Errorf("unexpected answer %+v", r)
		}
	case KindRelease:
		released, err := c.Route.Release(ctx, c.Lock, 0, op.Token, op.Owner)
		if err != nil {
			return err
		}
		op.Outcome = Lost
		if released {
			op.Outcome = Released
		}
	default:
		return fmt.Errorf("no lock operation %q", op.Kind)
	}
	return nil
}

// write bumps the ConfigMap's counter under the guard of token: read,
// then update with the read's resourceVersion, again on a plain conflict.
func (c *Client) write(ctx context.Context, owner string, token uint64) {
	for try := 0; try < 3; try++ {
		cm, err := c.Kube.CoreV1().ConfigMaps(c.Namespace).Get(ctx, c.Object, metav1.GetOptions{})
		if err != nil {
			return // nothing sent
		}
		n, _ := strconv.ParseInt(cm.Data["counter"], 10, 64)
		n++
		cm.Data = map[string]string{"counter": strconv.FormatInt(n, 10), "token": strconv.FormatUint(token, 10), "writer": owner}
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		cm.Annotations[permit.GuardAnnotation] = permit.Guard{Lock: c.Lock, Slot: 0, Token: token}.String()
		op := Op{Client: c.ID, Kind: KindWrite, Owner: owner, Token: token, Counter: n, Call: time.Now().UnixNano()}
		got, err := c.Kube.CoreV1().ConfigMaps(c.Namespace).Update(ctx, cm, metav1.UpdateOptions{})
		op.Return = time.Now().UnixNano()
		switch {
		case err == nil:
			op.Outcome = Written
			op.Version, _ = permit.Token(got.ResourceVersion)
		case strings.Contains(err.Error(), "kv_precondition"):
			op.Outcome, op.Error = Refused, err.Error()
		case apierrors.IsConflict(err) || strings.Contains(err.Error(), "failed calling webhook"):
			// The compare-and-swap failed, or admission could not run:
			// nothing was stored.
			op.Outcome, op.Error = Failed, err.Error()
		default:
			op.Outcome, op.Error = Unknown, err.Error()
		}
		c.Log(op)
		if !apierrors.IsConflict(err) || op.Outcome == Refused {
			return
		}
	}
}
