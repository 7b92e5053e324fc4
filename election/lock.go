// Package election is fenced leader election for controllers: client-go's
// leader election (and controller-runtime's, which is built on it) over a
// QueenLock permit instead of a Lease, with a client whose writes a
// replaced leader cannot land.
//
//	lock, err := election.New(cfg, "my-system", "my-controller", identity)
//	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
//		LeaderElection:                      true,
//		LeaderElectionResourceLockInterface: lock,
//		NewClient: func(cfg *rest.Config, o client.Options) (client.Client, error) {
//			c, err := client.New(cfg, o)
//			if err != nil {
//				return nil, err
//			}
//			return lock.Client(c), nil // mgr.GetClient() is fenced
//		},
//	})
//
// The Lock is one permit: lock name, slot 0, limit 1, owner the identity,
// ttlSeconds the lease duration. Acquiring creates it, renewing updates it
// keeping its acquireTime, taking over an expired one updates it with
// acquireTime cleared, and releasing deletes it with its token as the
// resourceVersion precondition. The API server's admission webhook stamps
// every time and decides every one of those writes by the server's clock
// (docs/leader-election.md), whatever a candidate believes.
//
// client-go's leader election does not fence: a leader paused past its
// lease goes on acting after another has taken over. What the Lock adds is
// the permit's token, which changes at every renew, and Client: every
// write to a guarded object carries the token of the moment, and the
// webhook refuses it once the token is not the permit's. From its first
// refusal on, the client refuses every write locally and the Lock reports
// the leadership lost, so client-go's OnStoppedLeading follows within its
// RenewDeadline. A leader whose lease is over on its own clock without a
// renew getting through does not send guarded writes at all.
package election

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/guard"
	"github.com/queen-locks/queen-locks/permit"
)

// Slot is the one slot of a leader election's lock.
const Slot = 0

// DefaultTimeout bounds each request of the Lock when the rest.Config sets
// none: half of client-go's and controller-runtime's default RenewDeadline
// (10 s), so that one hung request does not use up a leader's renew.
const DefaultTimeout = 5 * time.Second

// ErrLost is the error of every Get, Create and Update of a Lock whose
// leadership was lost: another holder took the permit over, its renew was
// refused, or it was deleted under it. A Lock that lost stays lost, so the
// process that lost does not lead again by mistake; make a new Lock (a new
// process, as controller-runtime does) to stand again.
var ErrLost = errors.New("queen-locks election: the leadership was lost")

// Lock is client-go's resourcelock.Interface over one QueenLock permit,
// and the guard.Source of the clients Client makes. It is safe for
// concurrent use.
type Lock struct {
	c          client.Client
	ns, name   string
	permitName string
	identity   string
	recorder   resourcelock.EventRecorder
	pod        *locksv1alpha1.PodRef
	guardOpts  []guard.Option
	clock      clock.PassiveClock
	timeout    time.Duration

	mu  sync.Mutex
	cur *locksv1alpha1.QueenLock // the version last read or written
	// holding is the acquireTime of this Lock's holding, nil when it holds
	// nothing; token is the holding's current token.
	holding *metav1.MicroTime
	token   uint64
	// validUntil ends the holding on this machine's clock: the lease
	// counted from when the last successful acquire or renew was sent, so
	// it ends before the server's does. Past it the token is not used,
	// and a guarded write is refused unsent.
	validUntil time.Time
	lost       error // set once, for good
	// pending: a create or takeover whose answer never came may have
	// landed; a permit of this identity read next is that holding.
	pending bool
	// transitions is the count last seen on the permit, for a create after
	// it was released or expired; seen tells whether there was one.
	transitions int32
	seen        bool
}

var (
	_ resourcelock.Interface = (*Lock)(nil)
	_ guard.Source           = (*Lock)(nil)
)

// New makes a Lock on the permit of lock name, slot 0, in namespace, for
// the candidate identity, which must be unique to the process (as
// controller-runtime's default, host name and a random suffix, is): two
// processes with one identity are one holder.
func New(cfg *rest.Config, namespace, name, identity string, opts ...Option) (*Lock, error) {
	if err := permit.ValidateName(name); err != nil {
		return nil, fmt.Errorf("queen-locks election: lock name %q: %w", name, err)
	}
	if err := permit.ValidateOwner(identity); err != nil {
		return nil, fmt.Errorf("queen-locks election: identity %q: %w", identity, err)
	}
	if namespace == "" {
		return nil, errors.New("queen-locks election: the namespace of the lock is empty")
	}
	l := &Lock{ns: namespace, name: name, permitName: permit.Name(name, Slot), identity: identity, clock: clock.RealClock{}}
	for _, o := range opts {
		o(l)
	}
	c := rest.CopyConfig(cfg)
	switch {
	case l.timeout > 0:
		c.Timeout = l.timeout
	case c.Timeout == 0:
		c.Timeout = DefaultTimeout
	}
	c = rest.AddUserAgent(c, "queen-locks-election")
	scheme := runtime.NewScheme()
	if err := locksv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	var err error
	if l.c, err = client.New(c, client.Options{Scheme: scheme}); err != nil {
		return nil, fmt.Errorf("queen-locks election: making the lock's client: %w", err)
	}
	return l, nil
}

// record is what Get answers for a permit, and its raw form: client-go
// compares raw records to tell a renew it did not see, so the token goes
// in too (the record's times have whole seconds only).
type record struct {
	resourcelock.LeaderElectionRecord
	Token string `json:"token"`
}

// Get reads the permit from the API server and answers it as client-go's
// record: holder identity the owner, lease duration ttlSeconds, the acquire
// and renew times as the server stamped them, and the leader election
// fields. A permit that does not exist (or is being deleted) answers
// NotFound. Once the Lock's own holding is gone (another holder, or no
// permit) it answers ErrLost, now and from then on.
func (l *Lock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	if err := l.lostErr(); err != nil {
		return nil, nil, err
	}
	p := &locksv1alpha1.QueenLock{}
	err := l.c.Get(ctx, client.ObjectKey{Namespace: l.ns, Name: l.permitName}, p)
	if err == nil && p.DeletionTimestamp != nil {
		err = apierrors.NewNotFound(schema.GroupResource{Group: locksv1alpha1.GroupVersion.Group, Resource: "queenlocks"}, l.permitName)
	}
	if apierrors.IsNotFound(err) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.holding != nil {
			return nil, nil, l.loseLocked(fmt.Errorf("permit %s/%s is gone: it expired or was deleted", l.ns, l.permitName))
		}
		l.cur = nil
		return nil, nil, err
	}
	if err != nil {
		return nil, nil, err
	}
	tok, err := permit.Token(p.ResourceVersion)
	if err != nil {
		return nil, nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != nil {
		return nil, nil, l.lost
	}
	ours := p.Spec.Owner == l.identity
	switch {
	case l.holding != nil && (!ours || !p.Spec.AcquireTime.Equal(l.holding)):
		return nil, nil, l.loseLocked(fmt.Errorf("permit %s/%s was taken over by %q", l.ns, l.permitName, p.Spec.Owner))
	case l.holding != nil:
		if tok > l.token { // our own renew, whose answer did not come
			l.token = tok
		}
	case ours && l.pending && p.Spec.AcquireTime != nil:
		// Our own create or takeover, whose answer did not come.
		l.holding, l.token = p.Spec.AcquireTime.DeepCopy(), tok
	}
	l.pending = false
	l.cur = p
	l.transitions, l.seen = p.Spec.LeaderTransitions, true
	r := recordOf(p)
	raw, err := json.Marshal(record{LeaderElectionRecord: *r, Token: p.ResourceVersion})
	if err != nil {
		return nil, nil, err
	}
	return r, raw, nil
}

func recordOf(p *locksv1alpha1.QueenLock) *resourcelock.LeaderElectionRecord {
	r := &resourcelock.LeaderElectionRecord{
		HolderIdentity:       p.Spec.Owner,
		LeaseDurationSeconds: int(p.Spec.TTLSeconds),
		LeaderTransitions:    int(p.Spec.LeaderTransitions),
		PreferredHolder:      p.Spec.PreferredHolder,
	}
	r.Strategy = coordinationv1.CoordinatedLeaseStrategy(p.Spec.Strategy)
	if t := p.Spec.AcquireTime; t != nil {
		r.AcquireTime = metav1.NewTime(t.Time)
	}
	if t := p.Spec.RenewTime; t != nil {
		r.RenewTime = metav1.NewTime(t.Time)
	}
	return r
}

// Create acquires the permit with a create, which wins only when no permit
// of that name exists. The count of transitions carries on from the one
// this Lock last saw on the permit (plus one: the permit changed hands),
// since a permit that was released or expired took its count with it.
func (l *Lock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	if err := l.check(ler); err != nil {
		return err
	}
	l.mu.Lock()
	transitions := int32(ler.LeaderTransitions)
	if l.seen {
		transitions = max(transitions, l.transitions+1)
	}
	l.mu.Unlock()
	p := &locksv1alpha1.QueenLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: l.ns, Name: l.permitName},
		Spec: locksv1alpha1.QueenLockSpec{
			Lock: l.name, Slot: Slot, Limit: 1, Owner: l.identity, TTLSeconds: int64(ler.LeaseDurationSeconds),
			HolderPod: l.pod.DeepCopy(), LeaderTransitions: transitions,
			PreferredHolder: ler.PreferredHolder, Strategy: string(ler.Strategy),
		},
	}
	sent := l.clock.Now()
	err := l.c.Create(ctx, p)
	return l.acquired(p, sent, err)
}

// acquired records the answer to a create or takeover of p.
func (l *Lock) acquired(p *locksv1alpha1.QueenLock, sent time.Time, err error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		// A refusal is an answer; anything else may have landed.
		l.pending = !isAnswer(err)
		return err
	}
	tok, terr := permit.Token(p.ResourceVersion)
	if terr != nil {
		return terr
	}
	if l.lost != nil {
		return l.lost
	}
	l.cur, l.holding, l.token, l.pending = p, p.Spec.AcquireTime.DeepCopy(), tok, false
	l.validUntil = sent.Add(time.Duration(p.Spec.TTLSeconds) * time.Second)
	l.transitions, l.seen = p.Spec.LeaderTransitions, true
	return nil
}

// isAnswer tells whether err is the API server's decision on a write, as
// opposed to no answer (a timeout, a connection that broke).
func isAnswer(err error) bool {
	switch {
	case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err), apierrors.IsNotFound(err),
		apierrors.IsInvalid(err), apierrors.IsForbidden(err), apierrors.IsBadRequest(err):
		return true
	}
	r := apierrors.ReasonForError(err)
	return r == permit.ReasonHeld || r == permit.ReasonLost
}

// Update writes the record client-go decided on:
//   - the Lock's own holding: a renew, one update conditional on the token
//     that keeps acquireTime; the server stamps the new times and answers
//     a new token;
//   - another holder's permit (or one of this identity that this Lock did
//     not acquire): a takeover, one update conditional on the version Get
//     read, with acquireTime cleared, which the webhook admits only once
//     the permit expired by the server's clock;
//   - an empty holder identity (client-go's release): a release, a delete
//     conditional on the token.
//
// A renew refused because the permit is no longer ours (expired, taken
// over, deleted) loses the leadership for good: ErrLost.
func (l *Lock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	if ler.HolderIdentity == "" {
		return l.release(ctx)
	}
	if err := l.check(ler); err != nil {
		return err
	}
	l.mu.Lock()
	cur, holding := l.cur, l.holding
	l.mu.Unlock()
	if cur == nil {
		return errors.New("queen-locks election: the permit was not read: call Get or Create first")
	}
	p := cur.DeepCopy()
	p.Spec.TTLSeconds = int64(ler.LeaseDurationSeconds)
	if holding != nil {
		// A renew: owner, acquireTime and the election fields as they are.
		sent := l.clock.Now()
		err := l.c.Update(ctx, p)
		return l.renewed(p, sent, err)
	}
	p.Spec.Owner = l.identity
	p.Spec.AcquireTime = nil
	p.Spec.HolderPod = l.pod.DeepCopy()
	p.Spec.PreferredHolder, p.Spec.Strategy = ler.PreferredHolder, string(ler.Strategy)
	// The count is a history: the webhook admits it unchanged or one up.
	if int32(ler.LeaderTransitions) > cur.Spec.LeaderTransitions {
		p.Spec.LeaderTransitions = cur.Spec.LeaderTransitions + 1
	}
	sent := l.clock.Now()
	err := l.c.Update(ctx, p)
	return l.acquired(p, sent, err)
}

// renewed records the answer to a renew of the Lock's holding.
func (l *Lock) renewed(p *locksv1alpha1.QueenLock, sent time.Time, err error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != nil {
		return l.lost
	}
	switch r := apierrors.ReasonForError(err); {
	case err == nil:
		tok, terr := permit.Token(p.ResourceVersion)
		if terr != nil {
			return terr
		}
		if l.holding != nil && p.Spec.AcquireTime.Equal(l.holding) {
			l.cur, l.token = p, tok
			l.validUntil = sent.Add(time.Duration(p.Spec.TTLSeconds) * time.Second)
		}
		return nil
	case r == permit.ReasonLost || r == permit.ReasonHeld || apierrors.IsNotFound(err):
		return l.loseLocked(fmt.Errorf("the renew of permit %s/%s was refused: %w", l.ns, l.permitName, err))
	default:
		// A conflict (written since: Get tells by whom) or no answer.
		return err
	}
}

// release deletes the Lock's permit, conditional on its token. The count
// of transitions goes with the permit; this Lock remembers it for its own
// next create, and another candidate carries it on only if it read it.
func (l *Lock) release(ctx context.Context) error {
	l.mu.Lock()
	cur, holding, lost := l.cur, l.holding, l.lost
	l.mu.Unlock()
	if lost != nil {
		return lost
	}
	if holding == nil || cur == nil {
		return errors.New("queen-locks election: nothing to release: this candidate does not hold the permit")
	}
	rv := cur.ResourceVersion
	err := l.c.Delete(ctx, cur, client.Preconditions{ResourceVersion: &rv, UID: &cur.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		return err // a conflict: our own renew landed meanwhile; client-go reads and tries again
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.holding.Equal(holding) {
		l.cur, l.holding, l.token = nil, nil, 0
		l.transitions, l.seen = cur.Spec.LeaderTransitions, true
	}
	return nil
}

// check refuses a record this Lock cannot write.
func (l *Lock) check(ler resourcelock.LeaderElectionRecord) error {
	if err := l.lostErr(); err != nil {
		return err
	}
	if ler.HolderIdentity != l.identity {
		return fmt.Errorf("queen-locks election: the record names holder %q, but this lock writes for %q only", ler.HolderIdentity, l.identity)
	}
	if err := permit.ValidateTTL(int64(ler.LeaseDurationSeconds)); err != nil {
		return fmt.Errorf("queen-locks election: lease duration %d s: %w (a lease of under a second is none)", ler.LeaseDurationSeconds, err)
	}
	return nil
}

// RecordEvent records a leader election event on the permit, when an
// EventRecorder was given.
func (l *Lock) RecordEvent(s string) {
	if l.recorder == nil {
		return
	}
	l.mu.Lock()
	subject := &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: l.ns, Name: l.permitName}}
	if l.cur != nil {
		subject.ObjectMeta = *l.cur.ObjectMeta.DeepCopy()
	}
	l.mu.Unlock()
	subject.APIVersion, subject.Kind = locksv1alpha1.GroupVersion.String(), "QueenLock"
	l.recorder.Eventf(subject, corev1.EventTypeNormal, "LeaderElection", "%s %s", l.identity, s)
}

// Identity is the candidate's identity, the permit's owner while it leads.
func (l *Lock) Identity() string { return l.identity }

// Describe names the permit: namespace/name of the QueenLock object.
func (l *Lock) Describe() string { return l.ns + "/" + l.permitName }
