// Package manager wires the operator together: the expiry controller, the
// admission webhooks, the HTTP route and their metrics, on one
// controller-runtime manager. cmd/manager and the local control plane of
// `make dev` both call it, so they run the same thing.
package manager

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/controllers"
	"github.com/queen-locks/queen-locks/controllers/gate"
	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/internal/webhookserver"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/locks/waiters"
	"github.com/queen-locks/queen-locks/permit/gatedpod"
	"github.com/queen-locks/queen-locks/webhook"
)

// MinServerVersion is the oldest Kubernetes whose resourceVersions are
// comparable integers (KEP-5504). On anything older a token could not be
// compared, so the manager does not start.
var MinServerVersion = version.MustParseGeneric("1.35.0")

// Scheme holds the types the manager reads and writes.
var Scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(Scheme))
	utilruntime.Must(locksv1alpha1.AddToScheme(Scheme))
}

// Options are the manager's settings; cmd/manager maps its flags onto them.
type Options struct {
	MetricsAddr string
	// MetricsInsecure serves metrics over plain HTTP to anyone who can
	// reach them. By default they are served over HTTPS, and each scrape
	// is authenticated (TokenReview) and authorized (SubjectAccessReview
	// for get on the non-resource URL /metrics), as kubebuilder scaffolds
	// it: the metrics name namespaces and callers.
	MetricsInsecure bool
	// MetricsCertDir holds tls.crt and tls.key for the metrics endpoint;
	// empty makes a self-signed certificate at start.
	MetricsCertDir string
	ProbeAddr      string
	WebhookHost    string
	WebhookPort    int
	CertDir        string
	// WebhookClientCAFile makes the webhook server require a client
	// certificate signed by these CAs (the API server's; docs/install.md).
	WebhookClientCAFile string
	// WebhookLimits bound the webhook server; webhookserver.DefaultLimits
	// when zero.
	WebhookLimits           webhookserver.Limits
	LeaderElect             bool
	LeaderElectionNamespace string
	ExpiryGrace             time.Duration
	Clock                   clock.PassiveClock

	// RouteAddr is where the HTTP route listens; empty runs no route.
	RouteAddr string
	// Auth is route.AuthToken or route.AuthNone.
	Auth string
	// DefaultNamespace is the namespace of calls that name none, with route.AuthNone.
	DefaultNamespace string
	// RouteAudiences are the audiences a caller's token may carry, with
	// route.AuthToken; route.Audience when empty.
	RouteAudiences []string
	// RouteTLSCertDir holds tls.crt and tls.key for the route; empty serves
	// plain HTTP.
	RouteTLSCertDir string
	// RouteLimits bound slow and large calls; route.DefaultLimits when zero.
	RouteLimits route.Limits
	// MaxWaiters bounds the acquires that wait (waitSeconds) at once on
	// this replica; half the route's MaxCalls when 0.
	MaxWaiters int

	// SkipNameValidation lets a process run more than one manager (tests
	// that need a second control plane); a real manager runs alone.
	SkipNameValidation bool
	// NoExpiry runs no expiry controller, for tests that take expired
	// permits over by hand and must not race it.
	NoExpiry bool
	// GatedPods serves the gated pods' webhook and runs their line on the
	// leader (docs/gated-pods.md). The webhook configuration and the
	// admission policies are installed with it (the chart's
	// gatedPods.enabled).
	GatedPods bool
	// GuardedResources are the kinds the guard webhooks are configured for
	// (the chart's guard.rules): every acquire raises the fence of the
	// slot's bound objects of these kinds, and a scale review of any other
	// kind is refused without a read. locks.DefaultGuardedResources
	// when empty.
	GuardedResources []schema.GroupVersionResource
}

// The fence: every acquire reads its slot's QueenLockFence and patches the
// bound objects' records; the guard webhook keeps the QueenLockFences and
// reads a bound object's metadata to drop an entry whose object is gone.
// +kubebuilder:rbac:groups="",resources=configmaps;secrets,verbs=get;patch
// +kubebuilder:rbac:groups=locks.queen.dev,resources=queenlockfences,verbs=get;create;update

// ParseGuardedResources reads --guarded-resources: comma-separated
// resource[.group]/version, as configmaps/v1 or deployments.apps/v1.
// An empty s guards nothing (the chart without the guard webhook).
func ParseGuardedResources(s string) ([]schema.GroupVersionResource, error) {
	out := []schema.GroupVersionResource{}
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		rg, version, ok := strings.Cut(item, "/")
		if !ok || rg == "" || version == "" || strings.Contains(version, "/") {
			return nil, fmt.Errorf("--guarded-resources: %q: want resource[.group]/version, as configmaps/v1 or deployments.apps/v1", item)
		}
		resource, group, _ := strings.Cut(rg, ".")
		out = append(out, schema.GroupVersionResource{Group: group, Version: version, Resource: resource})
	}
	return out, nil
}

// NewFence is the raise of bound objects' fence records, over cfg: the
// manager's identity, whose raises the guard webhook admits. It reads the
// slots' QueenLockFences from the API server (no cache) and asks for the
// bound objects' metadata only (PartialObjectMetadata), never their data.
func NewFence(cfg *rest.Config, resources []schema.GroupVersionResource) (*locks.Fence, error) {
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the fence's metadata client: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: Scheme})
	if err != nil {
		return nil, fmt.Errorf("creating the fence's client: %w", err)
	}
	return &locks.Fence{Client: c, Meta: meta, Resources: resources}, nil
}

// New checks the API server's version and builds a manager with every part
// registered. The caller starts it.
func New(cfg *rest.Config, o Options) (ctrl.Manager, error) {
	if o.ExpiryGrace < 0 {
		// A negative grace deletes permits before their lease ends: the
		// next acquire would hand the lock over while its holder may still
		// be working.
		return nil, fmt.Errorf("--expiry-grace is %s: it must not be negative", o.ExpiryGrace)
	}
	if err := CheckServerVersion(cfg); err != nil {
		return nil, err
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	// The manager's clients ask kube-apiserver for no gzip. It compresses
	// the events of every watch-list (each informer's watch, since
	// client-go's informers list by watching), one gzip stream per event:
	// a compressor set up and flushed per permit event in kube-apiserver,
	// a decompressor's 32 KiB window and buffers per watch here, and the
	// inflating of each event. Between the manager and kube-apiserver,
	// in a cluster's own network, the bytes saved buy nothing that costs
	// as much CPU on both sides (docs/development/benchmarks.md). Plain
	// requests are compressed only past 128 KiB (large lists), the one
	// place gzip saved bytes worth having; those are rare here.
	cfg = rest.CopyConfig(cfg)
	cfg.DisableCompression = true
	hooks, err := webhookserver.New(webhookserver.Options{Host: o.WebhookHost, Port: o.WebhookPort, CertDir: o.CertDir,
		ClientCAFile: o.WebhookClientCAFile, Limits: o.WebhookLimits, Log: ctrl.Log.WithName("webhook-server")})
	if err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  Scheme,
		Metrics:                 metricsOptions(o),
		HealthProbeBindAddress:  o.ProbeAddr,
		WebhookServer:           hooks,
		LeaderElection:          o.LeaderElect,
		LeaderElectionID:        "queen-locks-expiry.locks.queen.dev",
		LeaderElectionNamespace: o.LeaderElectionNamespace,
		// Releasing the lease on a clean stop lets the next replica take
		// expiry over at once instead of after the lease duration.
		LeaderElectionReleaseOnCancel: true,
		Controller:                    config.Controller{SkipNameValidation: &o.SkipNameValidation},
		// The only pods this cache holds are gated ones. Holder pods are
		// watched apart (controllers.Pods), by namespace, and only their
		// names and UIDs are kept.
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Label: labels.SelectorFromSet(labels.Set{gatedpod.Label: gatedpod.LabelValue})},
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	if !o.NoExpiry {
		// The holder pod watches are one per namespace with holder pods,
		// each open for as long as the leader leads: without gzip (above),
		// none keeps a decompressor's window and buffers, which with it
		// were most of what a watch cost this process.
		meta, err := metadata.NewForConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("creating the metadata client: %w", err)
		}
		core, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("creating the core client: %w", err)
		}
		expiry := &controllers.Expiry{
			Client:   mgr.GetClient(),
			Clock:    o.Clock,
			Grace:    o.ExpiryGrace,
			Recorder: mgr.GetEventRecorder("queen-locks"),
			Pods:     controllers.NewPods(meta, core),
		}
		if err := expiry.SetupWithManager(mgr); err != nil {
			return nil, fmt.Errorf("setting up the expiry controller: %w", err)
		}
		if err := (&controllers.Deletion{Client: mgr.GetClient()}).SetupWithManager(mgr); err != nil {
			return nil, fmt.Errorf("setting up the deletion controller: %w", err)
		}
	}
	// Every replica removes the waiters whose carriers are gone, so that a
	// line moves on whichever replica died.
	if err := (&controllers.LineSweep{Clock: o.Clock}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setting up the sweep of the lines: %w", err)
	}
	fence, err := NewFence(cfg, o.GuardedResources)
	if err != nil {
		return nil, err
	}
	if o.GatedPods {
		if err := setupGatedPods(mgr, cfg, o, fence); err != nil {
			return nil, err
		}
	}
	if err := (&webhook.QueenLock{Clock: o.Clock, Grace: o.ExpiryGrace, Fence: fence}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setting up the permit webhook: %w", err)
	}
	if err := (&webhook.Guard{Clock: o.Clock, Fence: fence}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setting up the guard webhook: %w", err)
	}
	if err := (&webhook.Subresources{Guarded: groupResources(fence.Kinds())}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setting up the guard webhook of subresources: %w", err)
	}
	if err := metrics.Registry.Register(&controllers.HeldCollector{Reader: mgr.GetCache(), Clock: o.Clock, Grace: o.ExpiryGrace}); err != nil {
		var dup prometheus.AlreadyRegisteredError
		if !errors.As(err, &dup) || !o.SkipNameValidation {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	if o.RouteAddr != "" {
		limits := o.RouteLimits
		if limits == (route.Limits{}) {
			limits = route.DefaultLimits()
		}
		if o.MaxWaiters == 0 {
			// Waiting calls hold call slots: leave half for the rest.
			o.MaxWaiters = limits.MaxCalls / 2
		}
		if o.MaxWaiters >= limits.MaxCalls {
			return nil, fmt.Errorf("--route-max-waiters is %d: it must be below --route-max-calls (%d), or waiting calls could take every call slot", o.MaxWaiters, limits.MaxCalls)
		}
		hub, err := waiters.ForManager(mgr, o.ExpiryGrace, o.MaxWaiters)
		if err != nil {
			return nil, err
		}
		srv, err := route.New(route.Config{
			Addr:             o.RouteAddr,
			Auth:             o.Auth,
			DefaultNamespace: o.DefaultNamespace,
			Audiences:        o.RouteAudiences,
			TLSCertDir:       o.RouteTLSCertDir,
			Limits:           o.RouteLimits,
			Waker:            hub,
			REST:             cfg,
			Scheme:           Scheme,
			Mapper:           mgr.GetRESTMapper(),
			Clock:            o.Clock,
			Log:              ctrl.Log.WithName("route"),
			Locks: []locks.Option{
				locks.WithGrace(o.ExpiryGrace),
				locks.WithVersions(locks.CachedVersions(mgr.GetCache())),
				locks.AsManager(),
				locks.WithFence(fence),
			},
		})
		if err != nil {
			return nil, err
		}
		if err := mgr.Add(srv); err != nil {
			return nil, fmt.Errorf("adding the route: %w", err)
		}
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		return nil, err
	}
	return mgr, nil
}

// setupGatedPods serves the pod webhook on every replica and runs the line
// on the leader.
func setupGatedPods(mgr ctrl.Manager, cfg *rest.Config, o Options, fence *locks.Fence) error {
	core, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating the core client: %w", err)
	}
	// Lock decisions read the API server itself, never the cache.
	direct, err := client.New(cfg, client.Options{Scheme: Scheme, Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return fmt.Errorf("creating the gated pods' client: %w", err)
	}
	(&webhook.GatedPods{Core: core, Clock: o.Clock}).SetupWithManager(mgr)
	line := &gate.Line{
		Client:   mgr.GetClient(),
		Core:     core,
		Locks:    locks.New(direct, o.Clock, locks.WithGrace(o.ExpiryGrace), locks.WithVersions(locks.CachedVersions(mgr.GetCache())), locks.AsManager(), locks.WithFence(fence)),
		Held:     locks.New(mgr.GetClient(), o.Clock),
		Grace:    o.ExpiryGrace,
		Clock:    o.Clock,
		Recorder: mgr.GetEventRecorderFor("queen-locks"), //nolint:staticcheck // SA1019: see gate.Line.Recorder: the events.k8s.io recorder keeps a series' first note
	}
	if err := line.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the gated pods' line: %w", err)
	}
	if err := metrics.Registry.Register(&gate.WaitingCollector{Reader: mgr.GetCache()}); err != nil {
		var dup prometheus.AlreadyRegisteredError
		if !errors.As(err, &dup) || !o.SkipNameValidation {
			return fmt.Errorf("registering metrics: %w", err)
		}
	}
	return nil
}

// CheckServerVersion refuses an API server older than MinServerVersion.
func CheckServerVersion(cfg *rest.Config) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating discovery client: %w", err)
	}
	info, err := dc.ServerVersion()
	if err != nil {
		return fmt.Errorf("reading the API server's version: %w", err)
	}
	return checkVersion(info.GitVersion)
}

func checkVersion(gitVersion string) error {
	v, err := version.ParseGeneric(gitVersion)
	if err != nil {
		return fmt.Errorf("reading the API server's version %q: %w", gitVersion, err)
	}
	if v.LessThan(MinServerVersion) {
		return fmt.Errorf("the API server is Kubernetes %s; queen-locks needs %s or later, where resourceVersions are comparable integers, and will not hand out tokens it cannot compare", gitVersion, MinServerVersion)
	}
	return nil
}

// metricsOptions serves metrics over HTTPS behind authentication and
// authorization, unless o asks for plain HTTP. controller-runtime's filter
// caches its reviews for a minute, which is fine for a scrape (the route's
// reviews have their own, shorter bound).
func metricsOptions(o Options) metricsserver.Options {
	if o.MetricsInsecure {
		return metricsserver.Options{BindAddress: o.MetricsAddr}
	}
	return metricsserver.Options{
		BindAddress:    o.MetricsAddr,
		SecureServing:  true,
		CertDir:        o.MetricsCertDir,
		FilterProvider: filters.WithAuthenticationAndAuthorization,
	}
}

// groupResources are the kinds of resources, without their versions.
func groupResources(rs []schema.GroupVersionResource) []schema.GroupResource {
	out := make([]schema.GroupResource, len(rs))
	for i, r := range rs {
		out[i] = r.GroupResource()
	}
	return out
}
