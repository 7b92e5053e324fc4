package controllers

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

// +kubebuilder:rbac:groups=locks.queen.dev,resources=queenlockwaiters,verbs=get;list;watch;create;patch;delete

// LineSweep removes waiters whose carrier is gone: a waiter whose object
// has not changed for its ttlSeconds, by this replica's own clock, since
// this replica first saw that version. Its carrier renews it every third
// of that; a carrier that stopped (a replica that died, a process killed,
// a connection whose call went without its leave getting through) stops
// renewing, and the waiter leaves the line within ttlSeconds and a sweep.
//
// No clock but this replica's is read: the renewTime on the object is the
// carrier's, and is not judged. Every replica sweeps (the line must move
// on while the leader is the one that died); the delete is conditional on
// the version judged, so a renew that lands first keeps the waiter, and
// two replicas deleting one waiter cost one failed delete.
type LineSweep struct {
	Client client.Reader // reads: the manager's cache
	Writer client.Client // deletes
	Clock  clock.PassiveClock
	Every  time.Duration

	seen map[types.UID]seenVersion
}

type seenVersion struct {
	rv string
	at time.Time
}

// SetupWithManager adds the sweep to every replica.
func (s *LineSweep) SetupWithManager(mgr ctrl.Manager) error {
	if s.Clock == nil {
		s.Clock = clock.RealClock{}
	}
	if s.Every <= 0 {
		s.Every = time.Second
	}
	if s.Client == nil {
		s.Client = mgr.GetCache()
	}
	if s.Writer == nil {
		s.Writer = mgr.GetClient()
	}
	s.seen = map[types.UID]seenVersion{}
	return mgr.Add(s)
}

// NeedLeaderElection is false: every replica sweeps.
func (s *LineSweep) NeedLeaderElection() bool { return false }

// Start sweeps every Every until ctx ends.
func (s *LineSweep) Start(ctx context.Context) error {
	t := time.NewTicker(s.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := s.sweep(ctx); err != nil && ctx.Err() == nil {
			logf.FromContext(ctx).Error(err, "sweeping the lines of locks")
		}
	}
}

func (s *LineSweep) sweep(ctx context.Context) error {
	var list locksv1alpha1.QueenLockWaiterList
	if err := s.Client.List(ctx, &list); err != nil {
		return fmt.Errorf("listing waiters: %w", err)
	}
	now := s.Clock.Now()
	live := make(map[types.UID]bool, len(list.Items))
	for i := range list.Items {
		w := &list.Items[i]
		if w.Spec.Pod != nil {
			continue // the gate's: it leaves with its pod
		}
		live[w.UID] = true
		v, ok := s.seen[w.UID]
		if !ok || v.rv != w.ResourceVersion {
			s.seen[w.UID] = seenVersion{rv: w.ResourceVersion, at: now}
			continue
		}
		ttl := time.Duration(max(w.Spec.TTLSeconds, 1)) * time.Second
		if now.Sub(v.at) < ttl || !w.DeletionTimestamp.IsZero() {
			continue
		}
		uid, rv := w.UID, w.ResourceVersion
		err := s.Writer.Delete(ctx, w, client.Preconditions{UID: &uid, ResourceVersion: &rv})
		switch {
		case err == nil:
			logf.FromContext(ctx).Info("removed a waiter whose carrier stopped renewing it", "namespace", w.Namespace, "lock", w.Spec.Lock, "owner", w.Spec.Owner, "name", w.Name)
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		default:
			return fmt.Errorf("removing waiter %s/%s: %w", w.Namespace, w.Name, err)
		}
	}
	for uid := range s.seen {
		if !live[uid] {
			delete(s.seen, uid)
		}
	}
	return nil
}
