// Command fenced-controller keeps a guarded ConfigMap in step with a
// source ConfigMap, from two or more replicas of which one leads. It is a
// controller-runtime controller whose leader election runs over a
// QueenLock permit (package election) and whose client is fenced by it: a
// replica that was paused or cut off past its lease, and wakes up still
// believing it leads, cannot overwrite what the next leader wrote.
//
//	fenced-controller --namespace team-a --source settings --target settings-copy
//
// The lines that differ from a controller on client-go's Lease lock are
// marked "fenced:"; README.md shows them.
package main

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/queen-locks/queen-locks/election"
)

// WrittenBy is the annotation on the target naming the replica that wrote
// it last.
const WrittenBy = "example.queen.dev/written-by"

func main() {
	var o options
	flag.StringVar(&o.namespace, "namespace", os.Getenv("POD_NAMESPACE"), "namespace of the ConfigMaps and of the lock")
	flag.StringVar(&o.lock, "lock", "fenced-controller", "name of the leader election lock")
	flag.StringVar(&o.source, "source", "settings", "ConfigMap to copy")
	flag.StringVar(&o.target, "target", "settings-copy", "guarded ConfigMap kept in step with the source")
	flag.StringVar(&o.identity, "identity", "", "this replica's identity (default: host name and a random suffix)")
	flag.DurationVar(&o.lease, "lease-duration", 15*time.Second, "leader election lease")
	flag.DurationVar(&o.renew, "renew-deadline", 10*time.Second, "leader election renew deadline")
	flag.DurationVar(&o.retry, "retry-period", 2*time.Second, "leader election retry period")
	zo := zap.Options{}
	zo.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zo)))
	if err := run(ctrl.SetupSignalHandler(), ctrl.GetConfigOrDie(), o); err != nil {
		fmt.Fprintln(os.Stderr, "fenced-controller:", err)
		os.Exit(1)
	}
}

type options struct {
	namespace, lock, source, target, identity string
	lease, renew, retry                       time.Duration
}

func run(ctx context.Context, cfg *rest.Config, o options) error {
	if o.namespace == "" {
		o.namespace = "default"
	}
	if o.identity == "" {
		host, err := os.Hostname()
		if err != nil {
			return err
		}
		o.identity = host + "_" + string(uuid.NewUUID())
	}
	// fenced: the lock is a QueenLock permit, and knows this replica's pod
	// (from the downward API) so that the permit is freed when it is gone.
	lock, err := election.New(cfg, o.namespace, o.lock, o.identity,
		election.WithHolderPod(os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME"), os.Getenv("POD_UID")))
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{o.namespace: {}}},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		LeaderElection:         true,
		// fenced: client-go's leader election runs over the permit...
		LeaderElectionResourceLockInterface: lock,
		LeaseDuration:                       &o.lease,
		RenewDeadline:                       &o.renew,
		RetryPeriod:                         &o.retry,
		LeaderElectionReleaseOnCancel:       true,
		// fenced: ...and mgr.GetClient() puts the permit's current token on
		// every write of a guarded object.
		NewClient: func(cfg *rest.Config, co client.Options) (client.Client, error) {
			c, err := client.New(cfg, co)
			if err != nil {
				return nil, err
			}
			return lock.Client(c), nil
		},
	})
	if err != nil {
		return err
	}
	r := &Reconciler{Client: mgr.GetClient(), Namespace: o.namespace, Source: o.source, Target: o.target, Identity: o.identity}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("fenced-controller").
		For(&corev1.ConfigMap{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(obj client.Object) bool {
			return obj.GetName() == o.source || obj.GetName() == o.target
		}))).
		Complete(r)
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// Reconciler copies the source's data into the target.
type Reconciler struct {
	Client                              client.Client
	Namespace, Source, Target, Identity string
}

// Reconcile writes the target when it differs from the source. Through the
// fenced client the target is created labelled guarded, and every write
// carries the guard; a replica replaced as leader gets guard.ErrLost, and
// its manager stops soon after.
func (r *Reconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	src := &corev1.ConfigMap{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: r.Source}, src); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	dst := &corev1.ConfigMap{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: r.Target}, dst)
	switch {
	case apierrors.IsNotFound(err):
		dst = &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: r.Target, Annotations: map[string]string{WrittenBy: r.Identity}},
			Data:       src.Data,
		}
		err = r.Client.Create(ctx, dst)
	case err != nil:
		return ctrl.Result{}, err
	case maps.Equal(dst.Data, src.Data):
		return ctrl.Result{}, nil
	default:
		dst.Data = src.Data
		if dst.Annotations == nil {
			dst.Annotations = map[string]string{}
		}
		dst.Annotations[WrittenBy] = r.Identity
		err = r.Client.Update(ctx, dst)
	}
	if err != nil {
		log.Info("write refused or failed", "target", r.Target, "error", err.Error())
		return ctrl.Result{}, err
	}
	log.Info("target in step", "target", r.Target, "resourceVersion", dst.ResourceVersion)
	return ctrl.Result{}, nil
}
