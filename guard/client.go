// Package guard fences a program's Kubernetes writes with the lock it holds.
//
// NewClient wraps a controller-runtime client so that every create, update,
// patch, apply and delete of a guarded kind (ConfigMaps and Secrets unless
// Kinds says otherwise) carries the guard annotation of the holding's
// current token, read as the write is sent. The admission webhook admits
// such a write only while that token is the permit's (docs/fencing.md).
//
//	c := lock.Client(mgr.GetClient()) // lock is a held *handle.Handle
//	err := c.Create(ctx, &corev1.ConfigMap{...}) // labelled guarded, sent under the guard
//	if errors.Is(err, guard.ErrLost) { ... } // a newer holder has the lock
package guard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DefaultKinds are the kinds the chart guards unless told otherwise
// (guard.rules in the chart's values).
var DefaultKinds = []schema.GroupKind{{Kind: "ConfigMap"}, {Kind: "Secret"}}

// maxResends bounds how often one write is sent again because the holder's
// own renew moved the token: renews come every third of the lifetime, so
// more than a couple in one write means something else is wrong.
const maxResends = 4

// Option adjusts a guarded client.
type Option func(*Client)

// Kinds sets the kinds whose writes carry the guard, instead of
// DefaultKinds: list the kinds the chart's guard.rules enable. An object
// of another kind is written as it is, and never given a guard annotation:
// one stored on an object the webhook does not watch would give away the
// token and later refuse the object's opt-in.
func Kinds(gks ...schema.GroupKind) Option {
	return func(c *Client) {
		c.kinds = map[schema.GroupKind]bool{}
		for _, gk := range gks {
			c.kinds[gk] = true
		}
	}
}

// Client is a client.Client whose writes of guarded kinds carry the guard
// of a Source. Reads and subresource writes go through unchanged (the
// webhook refuses status and scale writes of a guarded object: write the
// object itself).
type Client struct {
	client.Client
	src   Source
	kinds map[schema.GroupKind]bool
	lost  atomic.Bool
}

// NewClient wraps c so that its writes of guarded kinds carry the current
// guard of src. Once a write is refused because src's holding is gone, src
// is told (reason "guard") and every later write through the client is
// refused at once, unsent, with ErrLost.
func NewClient(c client.Client, src Source, opts ...Option) *Client {
	g := &Client{Client: c, src: src}
	Kinds(DefaultKinds...)(g)
	for _, o := range opts {
		o(g)
	}
	return g
}

// Lost tells whether a write through this client was refused because its
// holding was gone.
func (g *Client) Lost() bool { return g.lost.Load() }

// guardedKind tells whether obj is of a kind whose writes carry the guard.
func (g *Client) guardedKind(obj client.Object) (bool, error) {
	gvk, err := g.Client.GroupVersionKindFor(obj)
	if err != nil {
		return false, fmt.Errorf("queen-locks guard: telling the kind of %s: %w", objName(obj), err)
	}
	return g.kinds[gvk.GroupKind()], nil
}

// send makes one write under the fence of the moment, and makes it again
// when the holder's own renew moved the token between the read and the
// webhook's check. Any other refusal whose holding is gone is the loss.
func (g *Client) send(ctx context.Context, verb string, obj client.Object, write func(Fence) error) error {
	var next *refreshed
	for try := 0; ; try++ {
		if g.lost.Load() {
			return fmt.Errorf("%w: %s %s not sent", ErrLost, verb, objName(obj))
		}
		f, ok := g.src.Current()
		if !ok {
			return fmt.Errorf("%w: %s %s not sent", ErrNotHeld, verb, objName(obj))
		}
		if next != nil && f.Token == next.refused {
			// The source has not yet recorded the token Refresh read
			// from the permit (a renew whose answer is still on its way).
			f = next.Fence
		}
		if f.Namespace != "" && obj.GetNamespace() != f.Namespace {
			return fmt.Errorf("queen-locks guard: %s %s not sent: lock %q lives in namespace %s, and the webhook judges a guard by the permit in the object's own namespace",
				verb, objName(obj), f.Lock, f.Namespace)
		}
		err := write(f)
		if !IsRefused(err) {
			return err
		}
		cur, held, rerr := g.src.Refresh(ctx, f)
		switch {
		case rerr != nil:
			return fmt.Errorf("%w (and whether lock %q is still held could not be told: %v)", err, f.Lock, rerr)
		case !held:
			if g.lost.CompareAndSwap(false, true) {
				g.src.Lose(LostGuard)
			}
			return fmt.Errorf("%w: %w", ErrLost, err)
		case cur.Token == f.Token:
			// Still held with the very token refused: the refusal is
			// about the object (bound to another lock or slot, say).
			return err
		case try == maxResends:
			return fmt.Errorf("%w (sent %d times, the token moving each time)", err, try+1)
		}
		next = &refreshed{Fence: cur, refused: f.Token}
	}
}

// refreshed is a fence Refresh answered after a refusal of token refused.
type refreshed struct {
	Fence
	refused uint64
}

// IsRefused tells whether err is the guard webhook's refusal of a write,
// which names kv_precondition.
func IsRefused(err error) bool {
	if err == nil {
		return false
	}
	if apierrors.ReasonForError(err) == "kv_precondition" {
		return true
	}
	var status apierrors.APIStatus
	return errors.As(err, &status) && strings.Contains(status.Status().Message, "kv_precondition:")
}

func objName(obj client.Object) string {
	if ns := obj.GetNamespace(); ns != "" {
		return ns + "/" + obj.GetName()
	}
	return obj.GetName()
}
