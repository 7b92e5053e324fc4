//go:build linux

package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/queen-locks/queen-locks/internal/controlplane"
)

// proc is a process as /proc shows it; its start time tells it from a
// later process that reuses its PID.
type proc struct {
	pid, ppid int
	start     string
	comm      string
	zombie    bool
}

func readProc(pid int) (proc, bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return proc{}, false
	}
	s := string(raw)
	// comm is in parentheses and may hold spaces; the fields follow the
	// last ')'.
	open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	fields := strings.Fields(s[close+2:])
	ppid, _ := strconv.Atoi(fields[1])
	return proc{pid: pid, ppid: ppid, start: fields[19], comm: s[open+1 : close], zombie: fields[0] == "Z"}, true
}

// descendants are every live process below pid.
func descendants(pid int) []proc {
	entries, _ := os.ReadDir("/proc")
	children := map[int][]proc{}
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := readProc(n); ok {
			children[p.ppid] = append(children[p.ppid], p)
		}
	}
	var out []proc
	var walk func(int)
	walk = func(pid int) {
		for _, c := range children[pid] {
			out = append(out, c)
			walk(c.pid)
		}
	}
	walk(pid)
	return out
}

// alive tells whether p still runs (and is not a later process with its PID).
func alive(p proc) bool {
	now, ok := readProc(p.pid)
	return ok && now.start == p.start && !now.zombie
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startMakeDev runs make dev in a process group of its own, as a shell
// runs a foreground job, and waits until its route answers. It answers the
// process group, what runs in it below make, and make dev's directory (its
// kubeconfig).
func startMakeDev(t *testing.T) (cmd *exec.Cmd, procs []proc, exited <-chan error, logPath, dir string) {
	t.Helper()
	addr := freeAddr(t)
	dir = t.TempDir()
	cmd = exec.Command("make", "--no-print-directory", "dev")
	cmd.Dir = controlplane.Root()
	cmd.Env = append(os.Environ(), "QUEEN_LOCKS_DEV_ROUTE_ADDRESS="+addr, "QUEEN_LOCKS_DEV_DIR="+dir)
	log, err := os.Create(filepath.Join(t.TempDir(), "make-dev.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	exited = done
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		// Whatever the test found, leave nothing behind: the processes
		// this test started, by PID.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		for _, p := range procs {
			if alive(p) {
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
			}
		}
		if t.Failed() {
			raw, _ := os.ReadFile(log.Name())
			t.Logf("make dev's output:\n%s", raw)
		}
	})
	err = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		select {
		case err := <-exited:
			return false, fmt.Errorf("make dev exited: %v", err) //nolint:errorlint // err is nil when make exited 0: %w would print %!w(<nil>)
		default:
		}
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("make dev did not come up: %v", err)
	}
	procs = descendants(cmd.Process.Pid)
	names := map[string]bool{}
	for _, p := range procs {
		names[p.comm] = true
	}
	if !names["etcd"] || !names["kube-apiserver"] {
		t.Fatalf("make dev runs %v, want etcd and kube-apiserver among them", procs)
	}
	return cmd, procs, exited, log.Name(), dir
}

// awaitOutput waits until make dev has printed want.
func awaitOutput(t *testing.T, logPath, want string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		raw, _ := os.ReadFile(logPath)
		return strings.Contains(string(raw), want), nil
	})
	if err != nil {
		t.Fatalf("make dev never printed %q", want)
	}
}

// awaitAllGone waits until make and everything it started have exited,
// and checks that the dev process outlived etcd and kube-apiserver: it
// stopped them and waited for them, rather than exiting and leaving them to
// die, or not, on their own.
func awaitAllGone(t *testing.T, exited <-chan error, procs []proc) {
	t.Helper()
	var dev proc
	for _, p := range procs {
		for _, c := range procs {
			if c.ppid == p.pid && (c.comm == "etcd" || c.comm == "kube-apiserver") {
				dev = p
			}
		}
	}
	if dev.pid == 0 {
		t.Fatalf("no parent of etcd and kube-apiserver among %v", procs)
	}
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		// The dev process is read first: once it is gone, what it started
		// must already be gone, so reading them after cannot race.
		devAlive := alive(dev)
		var left []string
		for _, p := range procs {
			if p != dev && alive(p) {
				left = append(left, fmt.Sprintf("%s (pid %d)", p.comm, p.pid))
			}
		}
		if !devAlive && len(left) > 0 {
			return false, fmt.Errorf("%s exited while %s still ran", dev.comm, strings.Join(left, ", "))
		}
		return !devAlive && len(left) == 0, nil
	})
	if err != nil {
		t.Fatalf("after the signal: %v", err)
	}
	select {
	case <-exited: //nolint:errcheck // only that make exits matters here, not its status after the signal
	case <-time.After(time.Minute):
		t.Fatal("make did not exit")
	}
}

func skipUnlessControlPlane(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts make dev")
	}
	for _, tool := range []string{"etcd", "kube-apiserver", "kubectl", "controller-gen", "helm"} {
		if _, err := os.Stat(filepath.Join(controlplane.Root(), "bin", tool)); err != nil {
			t.Skipf("bin/%s is not built: run make tools", tool)
		}
	}
}

// A SIGTERM to make dev's whole process group, as a service manager or a
// closing terminal sends, reaches the dev process from the kernel and from
// make; one more while it stops (say, the service manager's second) does
// not cut the stopping short. Before that: the roles the docs bind a
// namespace's users to are installed.
func TestSIGTERMToTheProcessGroupStopsEverything(t *testing.T) {
	skipUnlessControlPlane(t)
	cmd, procs, exited, log, dir := startMakeDev(t)
	// What the docs have a namespace's users bound to is there to bind.
	// The route answers before make dev has written its kubeconfig; the
	// banner comes after.
	awaitOutput(t, log, "queen-locks is running.")
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{"queen-locks-holder", "queen-locks-viewer"} {
		if _, err := cs.RbacV1().ClusterRoles().Get(context.Background(), role, metav1.GetOptions{}); err != nil {
			t.Errorf("ClusterRole %s: %v", role, err)
		}
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	awaitOutput(t, log, "stopping the manager, kube-apiserver and etcd")
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) // make may be gone already
	awaitAllGone(t, exited, procs)
}

// Ctrl-C twice, the second while the first is being handled: the second
// must not cut the stopping short.
func TestCtrlCTwiceStopsEverything(t *testing.T) {
	skipUnlessControlPlane(t)
	cmd, procs, exited, log, _ := startMakeDev(t)
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	// A second signal sent before the first is taken would merge with it.
	awaitOutput(t, log, "stopping the manager, kube-apiserver and etcd")
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	awaitAllGone(t, exited, procs)
}
