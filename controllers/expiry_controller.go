// Package controller holds the expiry controller, which deletes each
// permit once its lifetime has ended (or its holder's pod is gone), so that
// a holder that died frees its slot, and the deletion controller, which lets
// a deleted permit go at once, whatever finalizers it carries.
package controllers

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
)

// DefaultGrace is how long past expireTime the controller waits before it
// deletes a permit: room for clock skew between the replica that stamped the
// time and the one that reads it, so an expiry never frees a slot early.
const DefaultGrace = time.Second

// +kubebuilder:rbac:groups=locks.queen.dev,resources=queenlocks,verbs=get;list;watch;delete;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Expiry deletes expired permits. It reads from the informer cache, which may
// be behind; that is safe because every delete carries the resourceVersion it
// judged, so a renew or takeover that landed first makes the delete fail.
// It never writes a held permit.
//
// With Pods set it also frees a permit as soon as the pod that holds it
// (spec.holderPod) is gone or has finished, with the same precondition: a
// renew or takeover that landed first wins.
type Expiry struct {
	Client   client.Client
	Clock    clock.PassiveClock
	Grace    time.Duration
	Recorder events.EventRecorder
	Pods     *Pods

	ends *holdEnds // the hold times' metric
}

// SetupWithManager registers the controller.
func (r *Expiry) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	grace := r.Grace
	graceFrom.Store(&grace)
	r.ends = newHoldEnds(r.Clock)
	b := ctrl.NewControllerManagedBy(mgr).
		For(&locksv1alpha1.QueenLock{}, builder.WithPredicates(predicate.Funcs{DeleteFunc: r.deleteMatters})).
		// The same informer again, to time the holdings that end: only
		// while this replica leads, as the controller runs.
		WatchesRawSource(source.Kind(mgr.GetCache(), &locksv1alpha1.QueenLock{}, r.ends.handler())).
		Named("queenlock-expiry").
		WithLogConstructor(reconcileLogs(mgr.GetLogger(), "queenlock-expiry", locksv1alpha1.GroupVersion.Group, "QueenLock")).
		// Permits often fall due together (a batch of jobs started at
		// once, a leader that was away): one delete at a time made the
		// 200th of such a batch wait for 199 round trips.
		WithOptions(controller.Options{MaxConcurrentReconciles: expiryWorkers})
	if r.Pods != nil {
		if err := mgr.Add(r.Pods); err != nil {
			return err
		}
		b = b.WatchesRawSource(source.Channel(r.Pods.Events, &handler.EnqueueRequestForObject{}))
	}
	return b.Complete(r)
}

// deleteMatters tells whether a permit's delete leaves the controller
// anything to do. A deleted permit has nothing left to expire; the one
// thing a reconcile of its delete does is stop following the pod it
// named, so a delete of a permit without a holder pod (the last version
// this replica saw) is not queued: about half of what the controller
// reconciled per acquire and release. A permit that named a pod in an
// earlier version was followed by that version's reconcile, and the
// update that cleared its holderPod queued one more, which stops
// following it. A delete this replica missed (its last state unknown) is
// queued all the same.
func (r *Expiry) deleteMatters(e event.DeleteEvent) bool {
	if r.Pods == nil {
		return false
	}
	p, ok := e.Object.(*locksv1alpha1.QueenLock)
	return e.DeleteStateUnknown || !ok || p.Spec.HolderPod != nil
}

// expiryWorkers is how many permits the leader judges and deletes at once.
// Each permit is one key of the queue, never handled by two at a time.
const expiryWorkers = 4

// Reconcile deletes the permit when its lifetime and the grace have passed,
// and otherwise comes back at that moment.
func (r *Expiry) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var p locksv1alpha1.QueenLock
	if err := r.Client.Get(ctx, req.NamespacedName, &p); err != nil {
		if apierrors.IsNotFound(err) && r.Pods != nil {
			r.Pods.Untrack(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !p.DeletionTimestamp.IsZero() {
		if r.Pods != nil {
			r.Pods.Untrack(req.NamespacedName)
		}
		return ctrl.Result{}, nil // Deletion lets it go, on every replica
	}
	if r.Pods != nil {
		if st := r.Pods.Track(ctx, &p); st.Gone {
			return ctrl.Result{}, r.free(ctx, &p, st.Why)
		}
	}
	now := r.Clock.Now()
	if p.Spec.ExpireTime != nil {
		if wait := p.Spec.ExpireTime.Add(r.Grace).Sub(now); wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
	}
	r.ends.deleting(&p, EndExpired)
	err := r.Client.Delete(ctx, &p, client.Preconditions{UID: &p.UID, ResourceVersion: &p.ResourceVersion})
	r.ends.deleted(&p, err)
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		// Released, renewed or taken over since the cache saw it: the watch
		// brings the new version, and with it the next deadline.
		return ctrl.Result{}, nil
	case err != nil:
		return ctrl.Result{}, fmt.Errorf("deleting expired permit %s: %w", req.NamespacedName, err)
	}
	expirations.WithLabelValues(p.Namespace).Inc()
	logf.FromContext(ctx).Info("permit expired", "lock", p.Spec.Lock, "slot", p.Spec.Slot, "owner", p.Spec.Owner,
		"expireTime", permit.FormatTime(p.Spec.ExpireTime.Time))
	if r.Recorder != nil {
		r.Recorder.Eventf(&p, nil, corev1.EventTypeNormal, "Expired", "Expire",
			"permit of lock %q slot %d held by %q expired at %s and was deleted",
			p.Spec.Lock, p.Spec.Slot, p.Spec.Owner, permit.FormatTime(p.Spec.ExpireTime.Time))
	}
	return ctrl.Result{}, nil
}

// free deletes a permit whose holder pod is gone, conditional on the
// version read: if the holder renewed, or another pod took it over, since,
// the delete fails and the watch brings the new version.
func (r *Expiry) free(ctx context.Context, p *locksv1alpha1.QueenLock, why string) error {
	r.ends.deleting(p, EndPodGone)
	err := r.Client.Delete(ctx, p, client.Preconditions{UID: &p.UID, ResourceVersion: &p.ResourceVersion})
	r.ends.deleted(p, err)
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return nil
	case err != nil:
		return fmt.Errorf("freeing permit %s/%s of a gone pod: %w", p.Namespace, p.Name, err)
	}
	releases.WithLabelValues(p.Namespace, "pod-gone").Inc()
	hp := p.Spec.HolderPod
	logf.FromContext(ctx).Info("holder pod gone: permit freed", "lock", p.Spec.Lock, "slot", p.Spec.Slot, "owner", p.Spec.Owner, "pod", hp.Namespace+"/"+hp.Name, "why", why)
	if r.Recorder != nil {
		r.Recorder.Eventf(p, nil, corev1.EventTypeNormal, "HolderPodGone", "Release",
			"permit of lock %q slot %d held by %q was freed: its pod %s/%s (uid %s) was %s", p.Spec.Lock, p.Spec.Slot, p.Spec.Owner, hp.Namespace, hp.Name, hp.UID, why)
	}
	return nil
}
