package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/test/internal/child"
	"github.com/queen-locks/queen-locks/test/internal/loopback"
	"github.com/queen-locks/queen-locks/test/internal/promtext"
)

// leaseName is the manager's leader election Lease, the name label of
// controller-runtime's leader_election_master_status.
const leaseName = "queen-locks-expiry.locks.queen.dev"

// managerProc is bin/manager run as a process of its own, as one replica
// runs in a cluster: under its own ServiceAccount (by impersonation, with
// the RBAC config/rbac generates), electing itself leader, serving the
// webhooks where envtest pointed the API server, the route, its probes
// and its metrics on loopback ports.
type managerProc struct {
	args    []string // args[0] is the binary
	env     []string
	logPath string
	// routeURL, probeURL and metricsURL are where it answers.
	routeURL, probeURL, metricsURL string

	pid  int
	proc *child.Process // nil before the first start
}

// managerUser is the manager's ServiceAccount as a user name, which its
// kubeconfig impersonates.
var managerUser = "system:serviceaccount:" + controlplane.ManagerNamespace + ":" + controlplane.ManagerServiceAccount

// newManager writes the manager's kubeconfig into dir, impersonating its
// ServiceAccount (controlplane.AsManagerServiceAccount made it and its
// rights), and picks its ports. It does not start it.
func newManager(env *controlplane.Env, bin, dir string, grace time.Duration) (*managerProc, error) {
	kc, err := clientcmd.Load(env.Env.KubeConfig)
	if err != nil {
		return nil, err
	}
	for _, a := range kc.AuthInfos {
		a.Impersonate = managerUser
	}
	kubeconfig := filepath.Join(dir, "kubeconfig-manager")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		return nil, err
	}
	var addrs [3]string
	for i := range addrs {
		if addrs[i], err = loopback.FreeAddr(); err != nil {
			return nil, err
		}
	}
	routeAddr, probeAddr, metricsAddr := addrs[0], addrs[1], addrs[2]
	wo := env.Env.WebhookInstallOptions
	return &managerProc{
		args: []string{bin,
			"--webhook-host", wo.LocalServingHost, "--webhook-port", strconv.Itoa(wo.LocalServingPort), "--webhook-cert-dir", wo.LocalServingCertDir,
			"--route-address", routeAddr, "--auth", route.AuthNone, "--default-namespace", "default",
			"--leader-elect", "--leader-election-namespace", controlplane.ManagerNamespace,
			"--expiry-grace", grace.String(),
			// Plain HTTP on loopback: each scrape would otherwise cost a
			// TokenReview and a SubjectAccessReview (docs/operations.md).
			"--metrics-bind-address", metricsAddr, "--metrics-insecure",
			"--health-probe-bind-address", probeAddr,
		},
		env:        append(os.Environ(), "KUBECONFIG="+kubeconfig),
		logPath:    filepath.Join(dir, "manager.log"),
		routeURL:   "http://" + routeAddr + route.Path,
		probeURL:   "http://" + probeAddr,
		metricsURL: "http://" + metricsAddr + "/metrics",
	}, nil
}

// start starts the manager; its output goes on at the end of its log.
func (m *managerProc) start() error {
	log, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fmt.Fprintf(log, "\n=== started %s\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(m.args[0], m.args[1:]...)
	cmd.Env = m.env
	cmd.Stdout, cmd.Stderr = log, log
	p, err := child.Start(cmd, func() { log.Close() })
	if err != nil {
		log.Close()
		return fmt.Errorf("starting the manager: %w", err)
	}
	m.pid, m.proc = p.Pid, p
	return nil
}

// exited tells whether the manager has exited (and been reaped: its pid
// may belong to another process by now). One never started has nothing
// running either.
func (m *managerProc) exited() bool { return m.proc == nil || m.proc.Exited() }

// stop sends SIGTERM, waits up to timeout, then kills it; it answers how
// long the manager took to exit after the SIGTERM.
func (m *managerProc) stop(timeout time.Duration) (time.Duration, error) {
	if m.exited() {
		return 0, nil
	}
	start := time.Now()
	if err := syscall.Kill(m.pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return 0, err
	}
	select {
	case <-m.proc.Done():
		return time.Since(start), nil
	case <-time.After(timeout):
	}
	_ = syscall.Kill(m.pid, syscall.SIGKILL)
	<-m.proc.Done()
	return time.Since(start), fmt.Errorf("the manager did not stop within %s of SIGTERM; killed", timeout)
}

// get answers the body of a GET of url, and an error unless it is 200.
func get(ctx context.Context, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return body, nil
}

// ready tells whether the manager's /readyz answers OK.
func (m *managerProc) ready(ctx context.Context) bool {
	_, err := get(ctx, m.probeURL+"/readyz")
	return err == nil
}

// managerMetrics is what is read from the manager's own metrics.
type managerMetrics struct {
	heapInUse        int64   // go_memstats_heap_inuse_bytes
	followed, named  float64 // queen_locks_holder_pods_followed, _named
	watched          float64 // queen_locks_holder_pod_namespaces_watched
	leader           bool    // leader_election_master_status of the expiry Lease
	holderPodErrors  float64 // queen_locks_holder_pod_errors_total
	expirations      float64 // queen_locks_expirations_total, all namespaces
	podGoneReleases  float64 // queen_locks_releases_total{reason="pod-gone"}
	scrapedFollowed  bool
	scrapedHeapInUse bool
}

var managerMetricNames = []string{
	"go_memstats_heap_inuse_bytes", "queen_locks_holder_pods_followed", "queen_locks_holder_pods_named",
	"queen_locks_holder_pod_namespaces_watched",
	"leader_election_master_status", "queen_locks_holder_pod_errors_total", "queen_locks_expirations_total", "queen_locks_releases_total",
}

// metrics scrapes the manager.
func (m *managerProc) metrics(ctx context.Context) (managerMetrics, error) {
	body, err := get(ctx, m.metricsURL)
	if err != nil {
		return managerMetrics{}, err
	}
	return managerMetricsOf(body)
}

func managerMetricsOf(body []byte) (managerMetrics, error) {
	s, err := promtext.Parse(bytes.NewReader(body), managerMetricNames...)
	if err != nil {
		return managerMetrics{}, fmt.Errorf("the manager's metrics: %w", err)
	}
	var mm managerMetrics
	var heap float64
	heap, mm.scrapedHeapInUse = promtext.Sum(s, "go_memstats_heap_inuse_bytes", nil)
	mm.heapInUse = int64(heap)
	mm.followed, mm.scrapedFollowed = promtext.Sum(s, "queen_locks_holder_pods_followed", nil)
	mm.named, _ = promtext.Sum(s, "queen_locks_holder_pods_named", nil)
	mm.watched, _ = promtext.Sum(s, "queen_locks_holder_pod_namespaces_watched", nil)
	leader, _ := promtext.Sum(s, "leader_election_master_status", map[string]string{"name": leaseName})
	mm.leader = leader >= 1
	mm.holderPodErrors, _ = promtext.Sum(s, "queen_locks_holder_pod_errors_total", nil)
	mm.expirations, _ = promtext.Sum(s, "queen_locks_expirations_total", nil)
	mm.podGoneReleases, _ = promtext.Sum(s, "queen_locks_releases_total", map[string]string{"reason": "pod-gone"})
	return mm, nil
}
