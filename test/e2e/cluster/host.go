// Package cluster runs a whole Kubernetes cluster on this machine for make
// e2e: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and a
// real node (containerd, runc, the bridge CNI plugin, the kubelet and
// kube-proxy) that runs the project's images as pods.
//
// Everything runs inside a network namespace the harness makes, with a
// bridge and a private pod range that exist only there: no packet leaves it,
// kube-proxy's iptables rules are its own, and the ports do not clash with
// other control planes on the machine. The processes also get a mount
// namespace of their own, so whatever the kubelet and containerd mount goes
// away with them, and a cgroup subtree of their own, so every container can
// be found and stopped. Host runs the tests in there and removes all of it
// afterwards, whatever happened inside.
package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Addresses of the private network. They exist only inside the harness's
// network namespace.
const (
	Bridge      = "qle2e0"
	NodeIP      = "10.88.0.1" // the bridge's address: the node, the API server
	PodCIDR     = "10.88.0.0/16"
	ServiceCIDR = "10.96.0.0/16"
)

// Environment variables between the two halves of the run.
const (
	envNetns = "QUEEN_LOCKS_E2E_NETNS" // set inside: the namespace's name
	envDir   = "QUEEN_LOCKS_E2E_DIR"   // the run's directory
)

// Inside says whether this process already runs in the harness's namespaces.
func Inside() bool { return os.Getenv(envNetns) != "" }

// The kernel settings the kubelet changes (vm.overcommit_memory and the
// others of its setupKernelTunables); Host puts back what they were.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// Host makes the namespaces, the bridge and the cgroups, runs this same
// test binary inside them with args, and removes everything afterwards. It
// answers the inner run's exit status.
func Host(args []string) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "e2e: a node (containerd, the kubelet, network namespaces) needs root")
		return 1
	}
	if err := checkTools(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	name := fmt.Sprintf("qle2e-%d", os.Getpid())
	dir, err := os.MkdirTemp("", "queen-locks-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	// Directories the image's user and the kubelet walk through.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	logf := func(format string, a ...any) { fmt.Fprintf(os.Stderr, "e2e: "+format+"\n", a...) }
	saved := saveSysctls()
	var cleanups []func() error
	cleanup := func() bool {
		ok := true
		for i := len(cleanups) - 1; i >= 0; i-- {
			if err := cleanups[i](); err != nil {
				logf("cleaning up: %v", err)
				ok = false
			}
		}
		restoreSysctls(saved, logf)
		return ok
	}
	status := 1
	defer func() {
		ok := cleanup()
		if status == 0 && ok {
			if err := os.RemoveAll(dir); err != nil {
				logf("removing %s: %v", dir, err)
			}
		} else {
			logf("logs and state kept in %s", dir)
		}
	}()

	if err := run("ip", "netns", "add", name); err != nil {
		logf("%v", err)
		return 1
	}
	cleanups = append(cleanups, func() error { return removeNetns(name, logf) })
	for _, c := range [][]string{
		{"ip", "-n", name, "link", "set", "lo", "up"},
		{"ip", "-n", name, "link", "add", Bridge, "type", "bridge"},
		{"ip", "-n", name, "addr", "add", NodeIP + "/16", "dev", Bridge},
		{"ip", "-n", name, "link", "set", Bridge, "up"},
		// Service addresses route to the bridge, so that a connection from
		// the namespace itself (the API server calling a webhook's
		// Service) has a route before kube-proxy's rules rewrite it.
		{"ip", "-n", name, "route", "add", ServiceCIDR, "dev", Bridge},
		// Pods reach Services backed by pods on the same bridge: the
		// packet is forwarded, and bridged traffic passes iptables so
		// kube-proxy's NAT applies both ways. Both are per namespace.
		{"ip", "netns", "exec", name, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"},
		{"ip", "netns", "exec", name, "sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1"},
	} {
		if err := run(c...); err != nil {
			logf("%v", err)
			return 1
		}
	}
	cgroups, err := makeCgroups(name)
	cleanups = append(cleanups, func() error { return removeCgroups(cgroups, logf) })
	if err != nil {
		logf("%v", err)
		return 1
	}

	// The inner run enters the network namespace alone (nsenter), keeping
	// this machine's /sys and its cgroup mounts, then takes a mount
	// namespace of its own whose mounts do not propagate back.
	self, err := os.Executable()
	if err != nil {
		logf("%v", err)
		return 1
	}
	cmd := exec.Command("nsenter", append([]string{"--net=/run/netns/" + name, "--",
		"unshare", "--mount", "--propagation", "slave", "--", self}, args...)...)
	cmd.Env = append(os.Environ(), envNetns+"="+name, envDir+"="+dir, "QUEEN_LOCKS_E2E_CGROUP=/"+name)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		logf("%v", err)
		return 1
	}
	// Ctrl-C or SIGTERM: the inner run stops its cluster, then we clean up.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-sigs:
			_ = cmd.Process.Signal(s)
			continue
		case err := <-done:
			status = cmd.ProcessState.ExitCode()
			if err != nil && status == 0 {
				status = 1
			}
		}
		break
	}
	return status
}

// checkTools finds the node's runtime, which comes from the distribution's
// packages, not from the project.
func checkTools() error {
	var missing []string
	for _, t := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc", "iptables", "ip", "nsenter", "unshare", "sysctl"} {
		if _, err := exec.LookPath(t); err != nil {
			missing = append(missing, t)
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(cniBinDir, p)); err != nil {
			missing = append(missing, filepath.Join(cniBinDir, p))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s; on Debian: apt-get install containerd runc containernetworking-plugins iptables", strings.Join(missing, ", "))
	}
	return nil
}

func run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// removeNetns kills what still runs in the namespace (containerd's shims,
// and anything the inner run could not stop), then deletes it: its bridge,
// its pods' links and its iptables rules go with it.
func removeNetns(name string, logf func(string, ...any)) error {
	for i := 0; i < 50; i++ {
		out, err := exec.Command("ip", "netns", "pids", name).Output()
		if err != nil {
			return fmt.Errorf("ip netns pids %s: %w", name, err)
		}
		pids := strings.Fields(string(out))
		if len(pids) == 0 {
			break
		}
		if i == 0 {
			logf("stopping %d processes left in the network namespace", len(pids))
		}
		for _, p := range pids {
			if pid, err := strconv.Atoi(p); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return run("ip", "netns", "del", name)
}

// makeCgroups makes the run's cgroup in every cgroup hierarchy: the
// kubelet's --cgroup-root, under which every pod and container lives.
func makeCgroups(name string) ([]string, error) {
	entries, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return nil, err
	}
	var made []string
	for _, e := range entries {
		h := filepath.Join("/sys/fs/cgroup", e.Name())
		// Every hierarchy, the cgroup v2 one of the hybrid layout too:
		// runc makes the container's cgroup in each.
		if !e.IsDir() {
			continue
		}
		p := filepath.Join(h, name)
		if err := os.Mkdir(p, 0o755); err != nil {
			return made, err
		}
		made = append(made, p)
		if e.Name() == "cpuset" {
			// A new cpuset has no CPUs or memory nodes until given its
			// parent's.
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return made, err
				}
				if err := os.WriteFile(filepath.Join(p, f), b, 0o644); err != nil {
					return made, err
				}
			}
		}
	}
	return made, nil
}

// removeCgroups kills every process still in the run's cgroups (containers
// whose shim is gone), then removes the cgroups, deepest first.
func removeCgroups(roots []string, logf func(string, ...any)) error {
	var errs []error
	for _, root := range roots {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for try := 0; try < 50; try++ {
			n := 0
			for _, d := range dirs {
				n += killProcs(filepath.Join(d, "cgroup.procs"))
			}
			if n == 0 {
				break
			}
			if try == 0 {
				logf("stopping %d processes left in %s", n, root)
			}
			time.Sleep(100 * time.Millisecond)
		}
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func killProcs(procs string) int {
	f, err := os.Open(procs)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if pid, err := strconv.Atoi(sc.Text()); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			n++
		}
	}
	return n
}

func saveSysctls() map[string]string {
	saved := map[string]string{}
	for _, s := range kubeletSysctls {
		if b, err := os.ReadFile("/proc/sys/" + s); err == nil {
			saved[s] = strings.TrimSpace(string(b))
		}
	}
	return saved
}

func restoreSysctls(saved map[string]string, logf func(string, ...any)) {
	for s, v := range saved {
		b, err := os.ReadFile("/proc/sys/" + s)
		if err == nil && strings.TrimSpace(string(b)) == v {
			continue
		}
		if err := os.WriteFile("/proc/sys/"+s, []byte(v), 0o644); err != nil {
			logf("restoring %s to %s: %v", s, v, err)
		}
	}
}
