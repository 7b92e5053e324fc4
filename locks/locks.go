// Package locks carries out the lock operations (acquire, renew, release,
// get, check) as Kubernetes writes on QueenLock permits. The HTTP route and
// the handles' direct transport both run them, so a lock behaves the same
// whichever way a caller reaches it.
//
// Each operation is one conditional write when it wins: acquire creates the
// permit, renew patches it (the manager's renew updates it, stamped: see
// AsManager) and release deletes it, each with the token as the
// resourceVersion precondition where there is one. Reads happen only after
// a write loses, to say why (already, held, lost) or to carry a stale token
// of the same owner through, and before a manager's renew whose version
// its informer does not hold. Those reads go to the API server itself:
// the client given to New must not be backed by an informer cache, which
// can be behind, and a decision on stale data answers wrongly.
package locks

import (
	"crypto/rand"
	"encoding/hex"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/permit"
)

// Reasons an operation did not get what it asked for, as the contract names them.
const (
	ReasonHeld           = permit.ReasonHeld
	ReasonLost           = permit.ReasonLost
	ReasonContended      = "contended"
	ReasonQuota          = "quota"
	ReasonKVPrecondition = "kv_precondition"
)

// DefaultTries bounds how many times an operation reads and tries again
// after losing a race, before it answers contended (acquire) or gives up.
const DefaultTries = 4

// Holder is one held permit of a lock.
type Holder struct {
	Slot      int
	Owner     string
	Token     uint64
	Since     time.Time
	RenewedAt time.Time
	ExpiresAt time.Time
}

// Permit is a permit the caller holds after an acquire or a renew.
type Permit struct {
	Slot      int
	Token     uint64
	Owner     string
	ExpiresAt time.Time
}

// Acquired is the answer to an acquire. When Acquired is false, Reason says
// why and Holders lists who holds the slots the caller can see.
type Acquired struct {
	Acquired bool
	Already  bool
	Permit
	Reason  string
	Holders []Holder
	// Waiting is how many wait in the lock's line, when the Client
	// counts them (CountsWaiting) and the answer is held.
	Waiting int
	// Floor is the first token of the holding answered: what the fence of
	// the slot's objects is raised to (see Fence).
	Floor uint64
}

// Renewed is the answer to a renew.
type Renewed struct {
	Renewed bool
	Permit
	Reason string
}

// Client runs lock operations against the API server.
type Client struct {
	c        client.Client
	clock    clock.PassiveClock
	tries    int
	grace    time.Duration
	versions Versions
	answered *memo
	deletes  dynamic.Interface // nil: deletes go through c
	stamps   bool              // AsManager: creates, renews and takeovers stamped here
	fence    *Fence            // WithFence: raised before an acquire answers
	// carrier names this Client's waiters in a line (WithCarrier).
	carrier string
	// countWaiting: held answers and Get count the line (CountsWaiting).
	countWaiting bool
}

// Option adjusts a Client.
type Option func(*Client)

// WithGrace makes acquire take over a permit only once it expired more than
// grace ago: the clock skew tolerated between the replicas that stamp and
// judge expiry. The webhook enforces the same; this only spares a write
// that would be refused.
func WithGrace(grace time.Duration) Option { return func(l *Client) { l.grace = grace } }

// WithVersions adds a source of permit versions (the manager's informer)
// that release consults before it falls back to a read.
func WithVersions(v Versions) Option { return func(l *Client) { l.versions = v } }

// New returns a Client over c, which must read from the API server (no cache).
func New(c client.Client, clk clock.PassiveClock, opts ...Option) *Client {
	if clk == nil {
		clk = clock.RealClock{}
	}
	l := &Client{c: c, clock: clk, tries: DefaultTries, answered: newMemo(100000), carrier: "kubernetes-api"}
	for _, o := range opts {
		o(l)
	}
	return l
}

// MintOwner makes an owner for a caller that sent none.
func MintOwner(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}
