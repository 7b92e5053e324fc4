package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// NodeName is the one node's name.
const NodeName = "qle2e-node"

// Images the node needs besides the project's. They are built by make
// e2e like the manager's and imported, as nothing can be pulled here.
const PauseImage = "queen-locks.test/e2e/pause:1"

// Config says where the binaries and images are.
type Config struct {
	Bin    string   // etcd, kube-*, kubelet, kubectl, helm
	Images []string // OCI archives to import into the node
}

// Cluster is the running control plane and node.
type Cluster struct {
	Dir        string
	Kubeconfig string
	Rest       *rest.Config
	Client     kubernetes.Interface

	procs []*proc
	logf  func(string, ...any)
}

// proc is one process of the cluster, logging to a file of the run.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// Start brings the cluster up inside the namespaces Host made. On error it
// stops what it started.
func Start(ctx context.Context, cfg Config, logf func(string, ...any)) (*Cluster, error) {
	dir := os.Getenv(envDir)
	if dir == "" || !Inside() {
		return nil, fmt.Errorf("cluster.Start runs inside cluster.Host's namespaces")
	}
	c := &Cluster{Dir: dir, logf: logf}
	if err := c.startAll(ctx, cfg); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) startAll(ctx context.Context, cfg Config) error {
	dir, logf := c.Dir, c.logf
	// A /run of this mount namespace's own: containerd 1.6's shims put
	// their sockets and runc its state under /run/containerd whatever the
	// configuration says, and they go away with the namespace.
	if err := syscall.Mount("tmpfs", "/run", "tmpfs", 0, "mode=755"); err != nil {
		return fmt.Errorf("mounting a tmpfs on /run in the run's mount namespace: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		return err
	}
	p, err := newPKI(filepath.Join(dir, "pki"))
	if err != nil {
		return err
	}
	c.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(c.Kubeconfig, p); err != nil {
		return err
	}
	if c.Rest, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		return err
	}
	if c.Client, err = kubernetes.NewForConfig(c.Rest); err != nil {
		return err
	}
	bin := func(name string) string { return filepath.Join(cfg.Bin, name) }

	start := time.Now()
	if err := c.start("etcd", bin("etcd"), "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "default=http://127.0.0.1:2380", "--unsafe-no-fsync"); err != nil {
		return err
	}
	if err := c.start("kube-apiserver", bin("kube-apiserver"),
		"--etcd-servers", "http://127.0.0.1:2379",
		"--bind-address", "0.0.0.0", "--secure-port", "6443", "--advertise-address", NodeIP,
		"--service-cluster-ip-range", ServiceCIDR,
		"--cert-dir", filepath.Join(dir, "apiserver"),
		"--tls-cert-file", p.path("apiserver.crt"), "--tls-private-key-file", p.path("apiserver.key"),
		"--client-ca-file", p.path("ca.crt"),
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", p.path("sa.pub"), "--service-account-signing-key-file", p.path("sa.key"),
		"--kubelet-client-certificate", p.path("admin.crt"), "--kubelet-client-key", p.path("admin.key"),
		// The node's address, never its name: no DNS server is reachable.
		"--kubelet-preferred-address-types", "InternalIP",
		"--allow-privileged=true"); err != nil {
		return err
	}
	if err := c.await(ctx, "kube-apiserver is ready", 2*time.Minute, func(ctx context.Context) (bool, error) {
		_, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil, nil
	}); err != nil {
		return err
	}
	logf("etcd and kube-apiserver ready after %s", time.Since(start).Round(time.Second))

	if err := c.start("kube-controller-manager", bin("kube-controller-manager"),
		"--kubeconfig", c.Kubeconfig, "--leader-elect=false", "--bind-address", "127.0.0.1",
		"--controllers", "*", "--use-service-account-credentials=false",
		"--service-account-private-key-file", p.path("sa.key"), "--root-ca-file", p.path("ca.crt")); err != nil {
		return err
	}
	if err := c.start("kube-scheduler", bin("kube-scheduler"),
		"--kubeconfig", c.Kubeconfig, "--leader-elect=false", "--bind-address", "127.0.0.1"); err != nil {
		return err
	}

	if err := c.startContainerd(ctx, cfg); err != nil {
		return err
	}
	if err := c.startKubelet(p, bin("kubelet")); err != nil {
		return err
	}
	if err := c.startKubeProxy(bin("kube-proxy")); err != nil {
		return err
	}
	if err := c.await(ctx, "the node is Ready", 3*time.Minute, func(ctx context.Context) (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	}); err != nil {
		return err
	}
	// Pods need their namespace's ServiceAccount, which the controller
	// manager makes: wait for default's before any test creates a pod.
	if err := c.await(ctx, "the default ServiceAccount exists", time.Minute, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return err
	}
	logf("cluster ready after %s: node %s, pods in %s, services in %s", time.Since(start).Round(time.Second), NodeName, PodCIDR, ServiceCIDR)
	return nil
}

// start starts one process, its output to logs/<name>.log. It dies with
// this process.
func (c *Cluster) start(name, path string, args ...string) error {
	log, err := os.Create(filepath.Join(c.Dir, "logs", name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
	return nil
}

// await polls cond until it holds, failing early when a process of the
// cluster exited.
func (c *Cluster) await(ctx context.Context, what string, timeout time.Duration, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		for _, p := range c.procs {
			select {
			case <-p.done:
				return false, fmt.Errorf("%s exited (%v); see %s", p.name, p.cmd.ProcessState, filepath.Join(c.Dir, "logs", p.name+".log"))
			default:
			}
		}
		return cond(ctx)
	})
	if err != nil {
		return fmt.Errorf("waiting until %s: %w", what, err)
	}
	return nil
}

// Stop stops the processes, last started first: SIGTERM, then SIGKILL
// after 20 s. Containers and shims are Host's to stop.
func (c *Cluster) Stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			c.logf("%s did not stop on SIGTERM within 20s; killing it", p.name)
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	c.procs = nil
}

// Kubectl runs bin/kubectl against the cluster.
func (c *Cluster) Kubectl(ctx context.Context, bin string, args ...string) (string, error) {
	return c.Tool(ctx, filepath.Join(bin, "kubectl"), args...)
}

// Tool runs a command with KUBECONFIG set to the cluster's; it answers the
// combined output.
func (c *Cluster) Tool(ctx context.Context, path string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig, "HOME="+c.Dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", filepath.Base(path), strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func writeKubeconfig(file string, p *pki) error {
	return os.WriteFile(file, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority: %s
users:
- name: admin
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: e2e
  context: {cluster: e2e, user: admin}
current-context: e2e
`, p.path("ca.crt"), p.path("admin.crt"), p.path("admin.key"))), 0o600)
}
