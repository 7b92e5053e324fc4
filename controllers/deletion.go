package controllers

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

// updateTimeout bounds one finalizer removal.
const updateTimeout = 3 * time.Second

// +kubebuilder:rbac:groups=locks.queen.dev,resources=queenlocks,verbs=get;list;watch;update

// Deletion lets a deleted permit go at once, whatever finalizers it carries.
// A foreground or orphan delete makes the API server add one, and a user
// may have added others; until they are gone the permit's name stays
// taken, and with it the slot, though the permit was released. A permit
// owns nothing, so there is nothing for them to wait for.
//
// It runs on every replica, not only on the leader: a delete must finish
// within seconds even while the leader is dead or cut off and the next one
// has not yet taken over. Two replicas racing to finish one delete is
// harmless: each update is conditional on the version and UID it read.
type Deletion struct {
	Client client.Client
}

// SetupWithManager registers the controller, for permits being deleted
// that still carry finalizers.
func (r *Deletion) SetupWithManager(mgr manager.Manager) error {
	terminating := predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return held(e.Object) },
		UpdateFunc:  func(e event.UpdateEvent) bool { return held(e.ObjectNew) },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(e event.GenericEvent) bool { return held(e.Object) },
	}
	return builder.ControllerManagedBy(mgr).
		For(&locksv1alpha1.QueenLock{}, builder.WithPredicates(terminating)).
		Named("queenlock-deletion").
		WithLogConstructor(reconcileLogs(mgr.GetLogger(), "queenlock-deletion", locksv1alpha1.GroupVersion.Group, "QueenLock")).
		WithOptions(controller.Options{
			NeedLeaderElection: ptr.To(false),
			// While the removal fails (kube-apiserver restarting, a webhook
			// replica gone) the lock stays unacquirable: try again soon,
			// not after the default backoff of up to minutes.
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](10*time.Millisecond, 500*time.Millisecond),
		}).
		Complete(r)
}

// held is whether obj is being deleted and something holds it back.
func held(obj client.Object) bool {
	return !obj.GetDeletionTimestamp().IsZero() && len(obj.GetFinalizers()) > 0
}

// Reconcile removes every finalizer of a permit being deleted.
//
// It must be an update (PUT) of the whole object, never a patch. When a
// write empties the finalizers of an object being deleted, kube-apiserver
// checks the write's resourceVersion, writes nothing, and then deletes the
// object under that name in a second step, with the preconditions of the
// request: an update carries the object's UID, a patch carries none. Two
// patches racing to empty the finalizers (two replicas, or one replica and
// kubectl) could then both pass the check; the first deletes the permit,
// the lock is acquired again under the same name, and the second deletes
// the new holder's permit. The chaos run found exactly that. With an
// update the second delete names the old UID and fails.
func (r *Deletion) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var p locksv1alpha1.QueenLock
	if err := r.Client.Get(ctx, req.NamespacedName, &p); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !held(&p) {
		return reconcile.Result{}, nil
	}
	finalizers := p.Finalizers
	p.Finalizers = nil
	// A write whose webhook call hangs (a replica cut off) is given up
	// early and tried again, rather than waiting out the webhook timeout.
	uctx, cancel := context.WithTimeout(ctx, updateTimeout)
	defer cancel()
	err := r.Client.Update(uctx, &p)
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return reconcile.Result{}, nil // gone, or changed: the watch brings the next version
	case err != nil:
		return reconcile.Result{}, fmt.Errorf("removing the finalizers %v of permit %s being deleted: %w", finalizers, req.NamespacedName, err)
	}
	logf.FromContext(ctx).Info("removed the finalizers of a deleted permit", "lock", p.Spec.Lock, "slot", p.Spec.Slot, "finalizers", finalizers)
	return reconcile.Result{}, nil
}
