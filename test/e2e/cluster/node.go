package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The node's runtime: containerd, runc and the CNI plugins from the
// distribution's packages.
const (
	cniBinDir = "/usr/lib/cni"
)

// startContainerd starts containerd with its state under the run's
// directory, the bridge CNI network and the pause image, and imports the
// images.
func (c *Cluster) startContainerd(ctx context.Context, cfg Config) error {
	root := filepath.Join(c.Dir, "containerd")
	cni := filepath.Join(c.Dir, "cni")
	for _, d := range []string{root, filepath.Join(cni, "net.d")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// One bridge on the network namespace's own range; the host-local IPAM
	// keeps its leases under the run's directory. No masquerade: nothing
	// leaves the namespace.
	conf := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "qle2e",
  "plugins": [{
    "type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "dataDir": %q,
      "ranges": [[{"subnet": %q, "rangeStart": "10.88.1.0", "gateway": %q}]],
      "routes": [{"dst": "0.0.0.0/0"}]}
  }]
}
`, Bridge, filepath.Join(cni, "ipam"), PodCIDR, NodeIP)
	if err := os.WriteFile(filepath.Join(cni, "net.d", "10-qle2e.conflist"), []byte(conf), 0o644); err != nil {
		return err
	}
	sock := c.containerdSocket()
	// QUEEN_LOCKS_E2E_RUNC names another runc (a wrapper that logs, say).
	runc := os.Getenv("QUEEN_LOCKS_E2E_RUNC")
	if runc == "" {
		runc = "runc"
	}
	toml := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[ttrpc]
  address = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  netns_mounts_under_state_dir = true
  # No negative oom_score_adj (the sandbox's -998): this machine does not
  # grant CAP_SYS_RESOURCE, and runc fails to start any pod asking for one.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = %q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, filepath.Join(root, "root"), filepath.Join(root, "state"), sock, sock+".ttrpc",
		filepath.Join(root, "opt"), PauseImage, runc, cniBinDir, filepath.Join(cni, "net.d"))
	config := filepath.Join(root, "config.toml")
	if err := os.WriteFile(config, []byte(toml), 0o644); err != nil {
		return err
	}
	if err := c.start("containerd", "containerd", "--config", config); err != nil {
		return err
	}
	if err := c.await(ctx, "containerd answers", time.Minute, func(ctx context.Context) (bool, error) {
		return exec.CommandContext(ctx, "ctr", "--address", sock, "version").Run() == nil, nil
	}); err != nil {
		return err
	}
	for _, img := range cfg.Images {
		start := time.Now()
		out, err := exec.CommandContext(ctx, "ctr", "--address", sock, "-n", "k8s.io", "images", "import", img).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr images import %s: %w\n%s", img, err, out)
		}
		c.logf("imported %s in %s: %s", filepath.Base(img), time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(out)))
	}
	return nil
}

func (c *Cluster) containerdSocket() string {
	return filepath.Join(c.Dir, "containerd", "containerd.sock")
}

// startKubelet starts the kubelet on cgroup v1 (cgroupfs), under the run's
// cgroup, with its state, pod logs and certificates under the run's
// directory.
func (c *Cluster) startKubelet(p *pki, kubelet string) error {
	root := filepath.Join(c.Dir, "kubelet")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	resolv := filepath.Join(root, "resolv.conf")
	// No DNS server runs in the cluster; pods name Services through
	// hostAliases.
	if err := os.WriteFile(resolv, nil, 0o644); err != nil {
		return err
	}
	config := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %s}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://%s
cgroupDriver: cgroupfs
cgroupRoot: %s
failCgroupV1: false
failSwapOn: false
# The kubelet's own: no CAP_SYS_RESOURCE here for its default -999.
oomScoreAdj: 0
resolvConf: %s
podLogsDir: %s
clusterDomain: cluster.local
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {"memory.available": "1Mi", "nodefs.available": "1%%", "imagefs.available": "1%%", "nodefs.inodesFree": "1%%"}
`, NodeIP, p.path("ca.crt"), c.containerdSocket(), os.Getenv("QUEEN_LOCKS_E2E_CGROUP"), resolv, filepath.Join(root, "pod-logs"))
	file := filepath.Join(root, "config.yaml")
	if err := os.WriteFile(file, []byte(config), 0o644); err != nil {
		return err
	}
	return c.start("kubelet", kubelet, "--config", file, "--kubeconfig", c.Kubeconfig,
		"--root-dir", root, "--hostname-override", NodeName, "--node-ip", NodeIP, "--v", "1")
}

// startKubeProxy starts kube-proxy in iptables mode: the rules live in the
// run's network namespace only.
func (c *Cluster) startKubeProxy(kubeProxy string) error {
	config := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: %s
hostnameOverride: %s
bindAddress: 127.0.0.1
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
clientConnection:
  kubeconfig: %s
conntrack:
  maxPerCore: 0
`, PodCIDR, NodeName, c.Kubeconfig)
	file := filepath.Join(c.Dir, "kube-proxy.yaml")
	if err := os.WriteFile(file, []byte(config), 0o644); err != nil {
		return err
	}
	return c.start("kube-proxy", kubeProxy, "--config", file)
}
