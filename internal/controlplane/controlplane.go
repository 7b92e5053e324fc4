// Package controlplane starts a real local control plane, for the tests and
// for make dev: etcd and kube-apiserver from bin/ through envtest, the
// QueenLock CRD, the webhook configurations, and the manager that serves
// them. Nothing in it is faked.
package controlplane

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"go.uber.org/zap/zapcore"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/locks/waiters"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/webhook"
)

// Options choose what the manager runs.
type Options struct {
	// ExpiryGrace is the manager's grace for clock skew: the controller
	// deletes, and the webhook admits a takeover, this long after expiry.
	ExpiryGrace time.Duration
	// NoExpiry runs no expiry controller: for tests that take over expired
	// permits by hand, so that the controller does not delete first.
	NoExpiry bool
	// Clock is the manager's clock (webhook and controller).
	Clock clock.PassiveClock
	// Configure, when set, is called with the manager before it starts.
	Configure func(ctrl.Manager) error
	// Verbose logs at info level; otherwise only errors are logged, so a
	// passing test suite prints little.
	Verbose bool
	// Bare starts etcd and kube-apiserver alone: no CRD, no webhook
	// configuration, no manager. For installing the chart itself.
	Bare bool
	// NoManager installs the CRD and the webhook configurations but runs no
	// manager in this process: the caller runs one (a separate process, say)
	// serving the webhooks at Env.Env.WebhookInstallOptions.
	NoManager bool
	// APIServerFlags are extra kube-apiserver flags, name to value.
	APIServerFlags map[string]string
	// ManagerConfig, when set, gives the manager's client configuration from
	// the admin's, after the CRD and webhooks are in: for running the
	// manager under a restricted identity.
	ManagerConfig func(e *Env) (*rest.Config, error)
	// LeaderElectionNamespace turns leader election on, with its Lease there.
	LeaderElectionNamespace string
	// MetricsAddr serves the manager's metrics (HTTPS, authorized per
	// scrape); empty serves none.
	MetricsAddr string
	// GatedPods installs the gated pods' webhook configuration, admission
	// policies and pod rights (config/gate) and runs the manager with gated
	// pods on, under its own ServiceAccount (AsManagerServiceAccount,
	// unless ManagerConfig says otherwise): the policies know the manager
	// by that identity.
	GatedPods bool
	// NoWebhookClientCert runs the manager's webhook server without
	// requiring kube-apiserver's client certificate (kube-apiserver still
	// presents it), as a cluster that cannot give it one does.
	NoWebhookClientCert bool
	// GuardedResources are the manager's --guarded-resources: configmaps
	// and secrets, as the chart's default, when nil.
	GuardedResources []schema.GroupVersionResource
	// RouteAddr, Auth and DefaultNamespace run the HTTP route in the manager.
	RouteAddr        string
	Auth             string
	DefaultNamespace string
}

// Env is a running control plane with the manager.
type Env struct {
	Env       *envtest.Environment
	Config    *rest.Config
	Client    client.Client // reads and writes the API server directly, as admin
	Clientset kubernetes.Interface
	Manager   ctrl.Manager
	// Grace is the manager's expiry grace: a takeover is admitted, and the
	// controller deletes, only this long after a permit's expireTime.
	Grace time.Duration
	// WebhookClientCAFile is the CA of the client certificate kube-apiserver
	// presents to webhooks (WebhookClientCert): what a manager's
	// --webhook-client-ca-file names.
	WebhookClientCAFile string
	WebhookClientCert   tls.Certificate
	// Waker wakes waiting acquires of the routes started here.
	Waker *waiters.Hub
	// managerConfig is the manager's client configuration: the admin's,
	// or its own identity's (Options.ManagerConfig). Routes started here
	// use it, as the manager's own route does.
	managerConfig *rest.Config
	// managerCreatesPolicy is whether the admission policy of the
	// manager's creates is installed (kube-apiserver 1.36 and later).
	managerCreatesPolicy bool
	stop                 context.CancelFunc
	done                 chan struct{}
	webhookClientDir     string
	err                  error
}

// Root is the module's root directory.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Start brings up etcd, kube-apiserver and the manager. Call Stop at the end.
func Start(o Options) (*Env, error) {
	level := zapcore.ErrorLevel
	if o.Verbose || os.Getenv("QUEEN_LOCKS_TEST_VERBOSE") != "" {
		level = zapcore.InfoLevel
	}
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true), zap.Level(level)))
	root := Root()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		os.Setenv("KUBEBUILDER_ASSETS", filepath.Join(root, "bin"))
	}
	// Generous timeouts: on a busy two-core machine kube-apiserver can take
	// longer than envtest's 20 s default to start or stop, and a stop that
	// times out leaves the processes behind.
	te := &envtest.Environment{ControlPlaneStartTimeout: time.Minute, ControlPlaneStopTimeout: time.Minute}
	clientDir, err := os.MkdirTemp("", "queen-locks-webhook-client-")
	if err != nil {
		return nil, err
	}
	admissionConfig, clientCA, clientCert, err := webhookClient(clientDir)
	if err != nil {
		_ = os.RemoveAll(clientDir)
		return nil, fmt.Errorf("making kube-apiserver's webhook client certificate: %w", err)
	}
	te.ControlPlane.GetAPIServer().Configure().Set("admission-control-config-file", admissionConfig)
	for name, value := range o.APIServerFlags {
		te.ControlPlane.GetAPIServer().Configure().Set(name, value)
	}
	if !o.Bare {
		te.CRDDirectoryPaths = []string{filepath.Join(root, "config", "crd", "bases")}
		te.ErrorIfCRDPathMissing = true
		te.WebhookInstallOptions = envtest.WebhookInstallOptions{
			Paths: []string{filepath.Join(root, "config", "webhook")},
		}
		if o.GatedPods {
			te.WebhookInstallOptions.Paths = append(te.WebhookInstallOptions.Paths, filepath.Join(root, "config", "gate", "webhook.yaml"))
		}
	}
	cfg, err := te.Start()
	if err != nil {
		// Start can fail after etcd and kube-apiserver are up (say, a CRD the
		// API server refuses): stop them rather than leave them behind.
		_ = te.Stop()
		_ = os.RemoveAll(clientDir)
		return nil, fmt.Errorf("starting the control plane (is bin/ built? run 'make tools'): %w", err)
	}
	e := &Env{Env: te, Config: cfg, WebhookClientCAFile: clientCA, WebhookClientCert: clientCert, webhookClientDir: clientDir}
	fail := func(err error) (*Env, error) {
		_ = te.Stop()
		_ = os.RemoveAll(clientDir)
		return nil, err
	}
	if e.Client, err = client.New(cfg, client.Options{Scheme: manager.Scheme}); err != nil {
		return fail(err)
	}
	if e.Clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		return fail(err)
	}
	if !o.Bare {
		if err := e.skipManagerWrites(); err != nil {
			return fail(err)
		}
	}
	if o.GatedPods && !o.Bare {
		for _, f := range []string{"config/gate/role.yaml", "config/gate/policies.yaml"} {
			if err := e.ApplyFile(f); err != nil {
				return fail(err)
			}
		}
	}
	if o.Bare || o.NoManager {
		e.stop, e.done = func() {}, make(chan struct{})
		close(e.done)
		return e, nil
	}
	if o.ExpiryGrace == 0 {
		o.ExpiryGrace = 200 * time.Millisecond
	}
	e.Grace = o.ExpiryGrace
	mcfg := cfg
	if o.GatedPods && o.ManagerConfig == nil {
		o.ManagerConfig = AsManagerServiceAccount
	}
	if o.ManagerConfig != nil {
		if mcfg, err = o.ManagerConfig(e); err != nil {
			return fail(err)
		}
		if err := e.awaitManagerCreates(mcfg); err != nil {
			return fail(err)
		}
	}
	e.managerConfig = mcfg
	wo := te.WebhookInstallOptions
	webhookCA := clientCA
	if o.NoWebhookClientCert {
		webhookCA = ""
	}
	mgr, err := manager.New(mcfg, manager.Options{
		MetricsAddr:         cmp.Or(o.MetricsAddr, "0"),
		ProbeAddr:           "0",
		WebhookHost:         wo.LocalServingHost,
		WebhookPort:         wo.LocalServingPort,
		CertDir:             wo.LocalServingCertDir,
		ExpiryGrace:         o.ExpiryGrace,
		WebhookClientCAFile: webhookCA,
		GuardedResources:    o.GuardedResources,
		NoExpiry:            o.NoExpiry,
		GatedPods:           o.GatedPods,
		Clock:               o.Clock,

		SkipNameValidation:      true,
		LeaderElect:             o.LeaderElectionNamespace != "",
		LeaderElectionNamespace: o.LeaderElectionNamespace,

		RouteAddr:        o.RouteAddr,
		Auth:             o.Auth,
		DefaultNamespace: o.DefaultNamespace,
	})
	if err != nil {
		return fail(err)
	}
	if o.Configure != nil {
		if err := o.Configure(mgr); err != nil {
			return fail(err)
		}
	}
	e.Manager = mgr
	// The routes tests start wake their waiting acquires from the
	// manager's watch, as the manager's own route does.
	if e.Waker, err = waiters.ForManager(mgr, o.ExpiryGrace, waiters.DefaultMaxWaiters); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.stop, e.done = cancel, make(chan struct{})
	go func() {
		e.err = mgr.Start(ctx)
		close(e.done)
	}()
	// Ready when the webhook server answers and the cache has synced.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		return mgr.GetWebhookServer().StartedChecker()(nil) == nil, nil
	})
	if err == nil && !mgr.GetCache().WaitForCacheSync(ctx) {
		err = fmt.Errorf("cache did not sync")
	}
	if err != nil {
		cancel()
		return fail(fmt.Errorf("waiting for the manager: %w", err))
	}
	return e, nil
}

// skipManagerWrites puts on the permit webhook the matchConditions that
// installs put there (config/default/webhook_manager_writes.yaml, and the
// chart's own), and installs the admission policy of the manager's creates
// where kube-apiserver serves it (config/default/manager_creates.yaml): the
// manager's stamped writes skip the webhook when the manager runs under its
// own identity (AsManagerServiceAccount). Under the admin's, as most tests
// run it, every write still goes through it.
func (e *Env) skipManagerWrites() error {
	const file = "config/default/webhook_manager_writes.yaml"
	raw, err := os.ReadFile(filepath.Join(Root(), file))
	if err != nil {
		return err
	}
	patch, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(admissionregistrationv1.SchemeGroupVersion.WithKind("MutatingWebhookConfiguration"))
	u.SetName("mutating-webhook-configuration")
	if err := e.Client.Patch(context.Background(), u, client.RawPatch(types.JSONPatchType, patch)); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	// The policy that lets the manager's creates skip the webhook is
	// installed where kube-apiserver serves it (1.36 and later), as the
	// chart installs it; elsewhere those creates go to the webhook.
	served, err := e.serves(admissionregistrationv1.SchemeGroupVersion.String(), "mutatingadmissionpolicies")
	if err != nil || !served {
		return err
	}
	e.managerCreatesPolicy = true
	return e.ApplyFile("config/default/manager_creates.yaml")
}

// serves tells whether kube-apiserver serves resource in groupVersion.
func (e *Env) serves(groupVersion, resource string) (bool, error) {
	rl, err := e.Clientset.Discovery().ServerResourcesForGroupVersion(groupVersion)
	if err != nil {
		return false, fmt.Errorf("discovering %s: %w", groupVersion, err)
	}
	return slices.ContainsFunc(rl.APIResources, func(r metav1.APIResource) bool { return r.Name == resource }), nil
}

// Done is closed when the manager has stopped; Err then says why.
func (e *Env) Done() <-chan struct{} { return e.done }

// Err is the manager's error once Done is closed.
func (e *Env) Err() error { return e.err }

// StopManager stops the manager alone: the webhooks stop answering while
// the API server goes on.
func (e *Env) StopManager() {
	e.stop()
	<-e.done
}

// Stop stops the manager, then the control plane.
func (e *Env) Stop() error {
	e.stop()
	<-e.done
	defer os.RemoveAll(e.webhookClientDir)
	return e.Env.Stop()
}

// Start after a minute: the environment is not what the tests assume.
func (e *Env) awaitManagerCreates(cfg *rest.Config) error {
	if !e.managerCreatesPolicy {
		return nil
	}
	self, err := webhook.WhoAmI(cfg)
	if err != nil {
		return err
	}
	if self != serviceaccount.MakeUsername(ManagerNamespace, ManagerServiceAccount) {
		return nil // not the identity the policy names: its creates go to the webhook
	}
	c, err := client.New(cfg, client.Options{Scheme: manager.Scheme})
	if err != nil {
		return err
	}
	var last error
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p := &locksv1alpha1.QueenLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ManagerNamespace, Name: permit.Name("probe", 0)},
			Spec:       locksv1alpha1.QueenLockSpec{Lock: "probe", Limit: 1, Owner: "probe", TTLSeconds: 1},
		}
		if _, err := permit.Stamp(nil, p, time.Now(), 0, permit.Caller{Manager: true}); err != nil {
			return false, err
		}
		if last = c.Create(ctx, p, client.DryRunAll); last != nil {
			return false, nil
		}
		if n := len(p.ManagedFields); n != 0 {
			last = fmt.Errorf("the dry run kept %d managedFields entries", n)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("the admission policy of the manager's creates never acted: %w (last: %w)", err, last)
	}
	return nil
}
