// Command manager runs queen-locks: the expiry controller, the admission
// webhooks and the HTTP route on port 6632.
package main

import (
	"flag"
	"os"
	"strings"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/queen-locks/queen-locks/controllers"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/internal/webhookserver"
)

func main() {
	var o manager.Options
	flag.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8443", "Address of the metrics endpoint; 0 turns it off.")
	flag.BoolVar(&o.MetricsInsecure, "metrics-insecure", false, "Serve metrics over plain HTTP without authentication. By default they are served over HTTPS, to callers allowed get on the non-resource URL /metrics (the chart's queen-locks-metrics-reader ClusterRole).")
	flag.StringVar(&o.MetricsCertDir, "metrics-cert-dir", "", "Directory with tls.crt and tls.key for the metrics endpoint; empty makes a self-signed certificate.")
	flag.StringVar(&o.ProbeAddr, "health-probe-bind-address", ":8081", "Address of /healthz and /readyz for the kubelet.")
	flag.StringVar(&o.WebhookHost, "webhook-host", "", "Address the admission webhook server binds (default: every interface).")
	flag.IntVar(&o.WebhookPort, "webhook-port", 9443, "Port of the admission webhook server.")
	flag.StringVar(&o.CertDir, "webhook-cert-dir", "", "Directory holding tls.crt and tls.key for the webhook server (default: the controller-runtime default).")
	flag.BoolVar(&o.LeaderElect, "leader-elect", true, "Elect one replica to run the expiry controller; every replica serves the webhooks and the route.")
	flag.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", "", "Namespace of the leader election Lease (default: the pod's).")
	flag.DurationVar(&o.ExpiryGrace, "expiry-grace", controllers.DefaultGrace, "How long past expireTime a permit is kept before the controller deletes it, for clock skew between replicas.")
	flag.BoolVar(&o.GatedPods, "gated-pods", false, "Serve the gated pods' webhook and admit gated pods (pods labelled locks.queen.dev/gate: \"true\") as their locks free; needs the pod webhook configuration, the admission policies and the rights on pods the chart installs with gatedPods.enabled.")
	flag.StringVar(&o.RouteAddr, "route-address", ":6632", "Address of the HTTP route POST /api/v1/locks; empty turns it off.")
	flag.StringVar(&o.Auth, "auth", route.AuthToken, "How the route authenticates callers: token (a ServiceAccount token verified with a TokenReview, each operation authorized with a SubjectAccessReview) or none (every caller unverified, on a loopback --route-address only; for development).")
	flag.StringVar(&o.DefaultNamespace, "default-namespace", "default", "With --auth=none, the namespace of calls that name none.")
	audiences := flag.String("route-audiences", route.Audience, "Comma-separated audiences a caller's token may carry (one is enough). Adding the API server's own audience lets callers send the token that also grants all their rights on the API server: only do so knowingly.")
	flag.StringVar(&o.RouteTLSCertDir, "route-tls-cert-dir", "", "Directory holding tls.crt and tls.key for the route, re-read when they change; empty serves plain HTTP.")
	l := route.DefaultLimits()
	flag.DurationVar(&l.ReadHeaderTimeout, "route-read-header-timeout", l.ReadHeaderTimeout, "Longest time to read a call's headers.")
	flag.DurationVar(&l.ReadTimeout, "route-read-timeout", l.ReadTimeout, "Longest time to read a whole call, headers and body.")
	flag.DurationVar(&l.WriteTimeout, "route-write-timeout", l.WriteTimeout, "Longest time from a call's headers to the end of its answer; must exceed the longest wait (60s) plus the operation timeout (20s).")
	flag.DurationVar(&l.IdleTimeout, "route-idle-timeout", l.IdleTimeout, "Longest time a kept-alive connection waits for its next call.")
	flag.IntVar(&l.MaxHeaderBytes, "route-max-header-bytes", l.MaxHeaderBytes, "Largest headers of a call.")
	flag.IntVar(&l.MaxConnections, "route-max-connections", l.MaxConnections, "Most open connections to the route; more wait to be accepted.")
	flag.IntVar(&l.MaxConnectionsPerSource, "route-max-connections-per-source", l.MaxConnectionsPerSource, "Most open connections to the route from one address; more are closed at once.")
	flag.IntVar(&l.MaxCalls, "route-max-calls", l.MaxCalls, "Most calls in progress; more are answered 429.")
	flag.IntVar(&l.MaxCallsPerSource, "route-max-calls-per-source", l.MaxCallsPerSource, "Most calls in progress from one address, counted before the caller's token is checked; more are answered 429.")
	flag.IntVar(&o.MaxWaiters, "route-max-waiters", 0, "Most acquires waiting for a slot (waitSeconds) at once; past it an acquire answers at once, as without a wait. 0: half of --route-max-calls.")
	flag.IntVar(&l.MaxCallsPerCaller, "route-max-calls-per-caller", l.MaxCallsPerCaller, "Most calls in progress of one caller; more are answered 429.")
	flag.Int64Var(&l.MaxBodyMemory, "route-max-body-memory", l.MaxBodyMemory, "Most bytes of call bodies held at once; a call whose body does not fit is answered 429.")
	wl := webhookserver.DefaultLimits()
	flag.StringVar(&o.WebhookClientCAFile, "webhook-client-ca-file", "", "PEM file of the CAs whose client certificates the webhook server accepts; when set, connections without such a certificate are refused at TLS. Give it the CA of the certificate the API server presents to webhooks (docs/install.md).")
	flag.DurationVar(&wl.ReadHeaderTimeout, "webhook-read-header-timeout", wl.ReadHeaderTimeout, "Longest time for the TLS handshake and a review's headers.")
	flag.DurationVar(&wl.ReadTimeout, "webhook-read-timeout", wl.ReadTimeout, "Longest time to read a whole review, headers and body.")
	flag.DurationVar(&wl.WriteTimeout, "webhook-write-timeout", wl.WriteTimeout, "Longest time from a review's headers to the end of its answer.")
	flag.DurationVar(&wl.IdleTimeout, "webhook-idle-timeout", wl.IdleTimeout, "Longest time a kept-alive connection waits for its next review.")
	flag.IntVar(&wl.MaxHeaderBytes, "webhook-max-header-bytes", wl.MaxHeaderBytes, "Largest headers of a review.")
	flag.IntVar(&wl.MaxConnections, "webhook-max-connections", wl.MaxConnections, "Most open connections to the webhook server (each carries one review at a time); more wait to be accepted.")
	flag.IntVar(&wl.MaxConnectionsPerSource, "webhook-max-connections-per-source", wl.MaxConnectionsPerSource, "Most open connections to the webhook server from one address; more are closed at once.")
	flag.Int64Var(&wl.MaxBody, "webhook-max-body", wl.MaxBody, "Largest review read, in bytes; a larger one is answered 413 unread. The default fits two objects of the largest the API server accepts (3 MiB each, JSON) and their envelope.")
	flag.Int64Var(&wl.MaxBodyMemory, "webhook-max-body-memory", wl.MaxBodyMemory, "Most bytes of review bodies above 64 KiB held at once; a review that does not fit is answered 429.")
	flag.Int64Var(&wl.MaxBodyMemoryPerSource, "webhook-max-body-memory-per-source", wl.MaxBodyMemoryPerSource, "Most bytes of review bodies above 64 KiB held at once from one address without a verified client certificate; more are answered 429.")
	zopts := zap.Options{}
	guarded := flag.String("guarded-resources", "configmaps/v1,secrets/v1", "Comma-separated kinds the guard webhook is configured for, as resource[.group]/version (deployments.apps/v1): every acquire raises the fence of the objects of these kinds bound to its slot before it answers. The chart sets it from guard.rules.")
	zopts.BindFlags(flag.CommandLine)
	flag.Parse()
	for _, a := range strings.Split(*audiences, ",") {
		if a = strings.TrimSpace(a); a != "" {
			o.RouteAudiences = append(o.RouteAudiences, a)
		}
	}
	o.RouteLimits = l
	o.WebhookLimits = wl
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zopts)))
	log := ctrl.Log.WithName("setup")
	var err error
	if o.GuardedResources, err = manager.ParseGuardedResources(*guarded); err != nil {
		log.Error(err, "cannot start")
		os.Exit(1)
	}
	if err := applyTestOnly(&o); err != nil {
		log.Error(err, "cannot start")
		os.Exit(1)
	}

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
