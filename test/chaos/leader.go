package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/election"
	"github.com/queen-locks/queen-locks/guard"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/permit"
)

// Fenced leaders: RoleLeader clients run client-go's leader election over
// package election's lock, as a controller's replicas do, and while
// leading write LeaderObject through the lock's fenced client (the guard
// of the current token on every write). The nemesis pauses them like any
// client and the hold keeps some of their writes inside kube-apiserver, so
// a leader wakes up, or its write lands, after the next one was elected;
// the checks (leader_check.go) show that no write of a replaced leader is
// stored after the next leader's acquire was answered.
const (
	// RoleLeader is a fenced leader candidate.
	RoleLeader = "leader"
	// LeaderLock is the leaders' lock; LeaderObject the ConfigMap they
	// write while leading.
	LeaderLock   = "chaos-leader"
	LeaderObject = "chaos-leader-object"
)

// Leader election timing: short, so that terms turn over often in a run.
// client-go needs LeaseDuration > RenewDeadline > RetryPeriod * 1.2.
const (
	leaderLease    = 3 * time.Second
	leaderDeadline = 2 * time.Second
	leaderRetry    = 500 * time.Millisecond
)

// loggedLock is election's lock, with its acquires and renews logged as
// Ops of LeaderLock: what the checks compare the record with.
type loggedLock struct {
	*election.Lock
	c *Client
}

func (l loggedLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	op := Op{Client: l.c.ID, Role: RoleLeader, Lock: LeaderLock, Kind: KindAcquire, Owner: l.Identity(), TTL: int64(ler.LeaseDurationSeconds), Call: time.Now().UnixNano()}
	err := l.Lock.Create(ctx, ler)
	l.log(op, err, Acquired)
	return err
}

func (l loggedLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	if ler.HolderIdentity == "" {
		return l.Lock.Update(ctx, ler) // client-go's release
	}
	kind, won := KindRenew, Renewed
	if l.Token() == 0 {
		kind, won = KindAcquire, Acquired // a takeover
	}
	op := Op{Client: l.c.ID, Role: RoleLeader, Lock: LeaderLock, Kind: kind, Owner: l.Identity(), Token: l.Token(), TTL: int64(ler.LeaseDurationSeconds), Call: time.Now().UnixNano()}
	err := l.Lock.Update(ctx, ler)
	l.log(op, err, won)
	return err
}

func (l loggedLock) log(op Op, err error, won string) {
	op.Return = time.Now().UnixNano()
	switch {
	case err == nil:
		op.Outcome, op.NewToken = won, l.Token()
	case errors.Is(err, election.ErrLost), apierrors.IsConflict(err), apierrors.IsAlreadyExists(err), apierrors.IsNotFound(err), apierrors.IsInvalid(err), apierrors.IsForbidden(err):
		op.Outcome, op.Error = Failed, err.Error()
	default:
		op.Outcome, op.Error = Unknown, err.Error()
	}
	l.c.Log(op)
}

// runLeader stands for election again and again: each term is a new Lock
// with a new identity (a Lock that lost stays lost, as a controller's
// process ends when it loses its lease), and writes while it leads.
func (c *Client) runLeader(ctx context.Context, stopped func() bool) {
	kc, err := client.New(c.REST, client.Options{Scheme: manager.Scheme})
	if err != nil {
		c.fatal(err)
		return
	}
	for term := 1; !stopped(); term++ {
		identity := fmt.Sprintf("l%d.%d", c.ID, term)
		lock, err := election.New(c.REST, c.Namespace, LeaderLock, identity, election.WithTimeout(2*time.Second))
		if err != nil {
			c.fatal(err)
			return
		}
		tctx, cancel := context.WithCancel(ctx)
		go func() {
			for !stopped() && tctx.Err() == nil {
				time.Sleep(50 * time.Millisecond)
			}
			cancel()
		}()
		leaderelection.RunOrDie(tctx, leaderelection.LeaderElectionConfig{
			Lock: loggedLock{Lock: lock, c: c}, LeaseDuration: leaderLease, RenewDeadline: leaderDeadline, RetryPeriod: leaderRetry,
			ReleaseOnCancel: true, Name: LeaderLock,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) { c.lead(lctx, lock, kc, identity) },
				OnStoppedLeading: func() {},
			},
		})
		cancel()
		c.pause(0, 300)
	}
}

// lead writes LeaderObject through the lock's fenced client until the
// leadership ends.
func (c *Client) lead(ctx context.Context, lock *election.Lock, kc client.Client, identity string) {
	fenced := lock.Client(kc)
	for ctx.Err() == nil {
		c.pause(50, 300)
		cm := &corev1.ConfigMap{}
		err := kc.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: LeaderObject}, cm)
		create := apierrors.IsNotFound(err)
		if err != nil && !create {
			continue
		}
		var n int64
		if create {
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: LeaderObject}}
		} else {
			n, _ = strconv.ParseInt(cm.Data["counter"], 10, 64)
		}
		n++
		token := lock.Token()
		cm.Data = map[string]string{"counter": strconv.FormatInt(n, 10), "writer": identity, "token": strconv.FormatUint(token, 10)}
		op := Op{Client: c.ID, Role: RoleLeader, Lock: LeaderLock, Kind: KindWrite, Owner: identity, Token: token, Counter: n, Create: create,
			Guard: permit.Guard{Lock: LeaderLock, Token: token}.String(), Call: time.Now().UnixNano()}
		if create {
			err = fenced.Create(ctx, cm)
		} else {
			err = fenced.Update(ctx, cm)
		}
		op.Return = time.Now().UnixNano()
		switch {
		case err == nil:
			op.Outcome = Written
			op.Version, _ = permit.Token(cm.ResourceVersion)
		case errors.Is(err, guard.ErrLost):
			// Refused, by the webhook or locally: the leadership is over.
			op.Outcome, op.Error = Refused, err.Error()
		default:
			op.Outcome, op.Error = writeOutcome(err), err.Error()
		}
		c.Log(op)
	}
}

// fatal reports a client that cannot run at all.
func (c *Client) fatal(err error) {
	c.Log(Op{Client: c.ID, Role: c.Role, Kind: "setup", Outcome: Failed, Error: err.Error(), BadCall: true})
}
