// Command manager runs queen-locks: the expiry controller, the admission
// webhooks and the HTTP route on port 6632.
package main

import (
	"flag"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/queen-locks/queen-locks/controllers"
	"github.com/queen-locks/queen-locks/manager"
	"github.com/queen-locks/queen-locks/route"
)

func main() {
	var o manager.Options
	flag.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8080", "Address of the metrics endpoint; 0 turns it off.")
	flag.StringVar(&o.ProbeAddr, "health-probe-bind-address", ":8081", "Address of /healthz and /readyz for the kubelet.")
	flag.StringVar(&o.WebhookHost, "webhook-host", "", "Address the admission webhook server binds (default: every interface).")
	flag.IntVar(&o.WebhookPort, "webhook-port", 9443, "Port of the admission webhook server.")
	flag.StringVar(&o.CertDir, "webhook-cert-dir", "", "Directory holding tls.crt and tls.key for the webhook server (default: the controller-runtime default).")
	flag.BoolVar(&o.LeaderElect, "leader-elect", true, "Elect one replica to run the expiry controller; every replica serves the webhooks and the route.")
	flag.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", "", "Namespace of the leader election Lease (default: the pod's).")
	flag.DurationVar(&o.ExpiryGrace, "expiry-grace", controllers.DefaultGrace, "How long past expireTime a permit is kept before the controller deletes it, for clock skew between replicas.")
	flag.StringVar(&o.RouteAddr, "route-address", ":6632", "Address of the HTTP route POST /api/v1/locks; empty turns it off.")
	flag.StringVar(&o.Auth, "auth", route.AuthToken, "How the route authenticates callers: token (act as the caller with its bearer token) or none (the manager's own identity; for development only).")
	flag.StringVar(&o.DefaultNamespace, "default-namespace", "default", "With --auth=none, the namespace of calls that name none.")
	zopts := zap.Options{}
	zopts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zopts)))
	log := ctrl.Log.WithName("setup")

	mgr, err := manager.New(ctrl.GetConfigOrDie(), o)
	if err != nil {
		log.Error(err, "cannot start")
		os.Exit(1)
	}
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "manager stopped")
		os.Exit(1)
	}
}
