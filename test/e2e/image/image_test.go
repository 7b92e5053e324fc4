// Package image tests the manager image make image writes, without a
// container runtime: it unpacks the archive's root filesystem and runs the
// image's entrypoint in it (chroot) as the image's user, against the local
// control plane, as a runtime would start it.
package image

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/test/e2e/oci"
)

// leaseName is the manager's leader election Lease.
const leaseName = "queen-locks-expiry.locks.queen.dev"

func TestImage(t *testing.T) {
	archive := os.Getenv("QUEEN_LOCKS_IMAGE")
	if archive == "" {
		t.Skip("QUEEN_LOCKS_IMAGE names no archive; make image-test builds one and sets it")
	}
	if os.Geteuid() != 0 {
		t.Skip("running the entrypoint in the image's root filesystem as its user takes root (chroot, setuid)")
	}
	img, err := oci.Read(archive)
	if err != nil {
		t.Fatal(err)
	}
	cfg := img.Config
	if cfg.OS != "linux" || len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != "/manager" {
		t.Fatalf("image %s: os %q, entrypoint %q; want linux, [/manager]", img.Name, cfg.OS, cfg.Config.Entrypoint)
	}
	uid, gid, err := cfg.UIDGID()
	if err != nil {
		t.Fatal(err)
	}
	if uid != 65532 || gid != 65532 {
		t.Fatalf("image user %d:%d, want 65532:65532", uid, gid)
	}

	rootfs := t.TempDir()
	// After chroot this is "/", which the image's user must be able to enter.
	if err := os.Chmod(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := img.Unpack(rootfs); err != nil {
		t.Fatal(err)
	}
	checkFiles(t, rootfs)

	env, err := controlplane.Start(controlplane.Options{NoManager: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	ns := env.Namespace(t, "image")

	// What the pod would get from its volumes: a kubeconfig for the API
	// server and the webhook's serving certificate, readable by the user.
	tmp := filepath.Join(rootfs, "tmp")
	writeOwned(t, filepath.Join(tmp, "kubeconfig"), env.Env.KubeConfig, uid, gid)
	wo := env.Env.WebhookInstallOptions
	for _, f := range []string{"tls.crt", "tls.key"} {
		b, err := os.ReadFile(filepath.Join(wo.LocalServingCertDir, f))
		if err != nil {
			t.Fatal(err)
		}
		writeOwned(t, filepath.Join(tmp, "certs", f), b, uid, gid)
	}

	routeAddr, probeAddr := freeAddr(t), freeAddr(t)
	logs := &syncBuffer{}
	mgr := inImage(rootfs, uid, gid, cfg.Config.Env, cfg.Config.Entrypoint[0],
		"--webhook-host", wo.LocalServingHost, "--webhook-port", strconv.Itoa(wo.LocalServingPort), "--webhook-cert-dir", "/tmp/certs",
		"--route-address", routeAddr, "--auth", "none", "--default-namespace", ns,
		"--leader-elect", "--leader-election-namespace", ns,
		"--metrics-bind-address", "0", "--health-probe-bind-address", probeAddr)
	mgr.Stdout, mgr.Stderr = logs, logs
	if err := mgr.Start(); err != nil {
		t.Fatalf("starting the image's entrypoint: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- mgr.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = mgr.Process.Kill()
			<-exited //nolint:errcheck // killed: its exit status says nothing
		}
		if t.Failed() {
			t.Logf("manager output:\n%s", logs.String())
		}
	})

	if got := procUID(t, mgr.Process.Pid); got != uid {
		t.Errorf("the manager runs as uid %d, want %d", got, uid)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	await := func(what string, cond func(context.Context) (bool, error)) {
		t.Helper()
		err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			select {
			case err := <-exited:
				stopped = true
				return false, fmt.Errorf("the manager exited: %v", err) //nolint:errorlint // err is nil when the manager exited 0: %w would print %!w(<nil>)
			default:
			}
			return cond(ctx)
		})
		if err != nil {
			t.Fatalf("waiting until %s: %v", what, err)
		}
	}

	for _, probe := range []string{"/healthz", "/readyz"} {
		await("the probe "+probe+" passes", func(ctx context.Context) (bool, error) {
			resp, err := http.Get("http://" + probeAddr + probe)
			if err != nil {
				return false, nil
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK, nil
		})
	}

	await("the manager holds the leader election Lease", func(ctx context.Context) (bool, error) {
		l, err := env.Clientset.CoordinationV1().Leases(ns).Get(ctx, leaseName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "", nil
	})

	// An acquire through the route creates a QueenLock, which the API server
	// admits only after the mutating webhook (failurePolicy Fail) answered:
	// a won acquire shows both the route and the webhooks served.
	body := `{"operations":[{"op":"acquire","name":"image-test","ttlSeconds":60,"owner":"image-owner"}]}`
	resp, err := http.Post("http://"+routeAddr+"/api/v1/locks", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var answer struct {
		Results []struct {
			Acquired bool   `json:"acquired"`
			Token    uint64 `json:"token"`
			Reason   string `json:"reason"`
		} `json:"results"`
	}
	if err := json.Unmarshal(b, &answer); err != nil || resp.StatusCode != http.StatusOK || len(answer.Results) != 1 || !answer.Results[0].Acquired {
		t.Fatalf("acquire through the route: HTTP %d %s (%v)", resp.StatusCode, b, err)
	}
	if answer.Results[0].Token == 0 {
		t.Errorf("acquire answered token 0: %s", b)
	}

	// The CLI in the same image, as the same user, sees the holder.
	cli := inImage(rootfs, uid, gid, cfg.Config.Env, "/queenlock", "get", "image-test", "--server", "http://"+routeAddr)
	out, err := cli.CombinedOutput()
	if err != nil {
		t.Fatalf("/queenlock get in the image: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte(`"image-owner"`)) {
		t.Errorf("/queenlock get does not show the holder image-owner:\n%s", out)
	}

	// SIGTERM, as the kubelet stops a pod: the manager exits cleanly.
	if err := mgr.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Errorf("the manager exited with %v on SIGTERM, want status 0", err)
		}
	case <-time.After(time.Minute):
		t.Errorf("the manager did not exit within a minute of SIGTERM")
	}
}

// inImage is a command run from the image's root filesystem as its user,
// with the image's environment and nothing of the test's.
func inImage(rootfs string, uid, gid uint32, env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Path = name // resolved inside the chroot, not on this machine's PATH
	cmd.Dir = "/"
	cmd.Env = append(slices.Clone(env), "KUBECONFIG=/tmp/kubeconfig", "HOME=/home/nonroot")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Chroot:     rootfs,
		Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}},
	}
	return cmd
}

// checkFiles checks what the binaries need from the root filesystem.
func checkFiles(t *testing.T, rootfs string) {
	t.Helper()
	for _, bin := range []string{"manager", "queenlock"} {
		fi, err := os.Stat(filepath.Join(rootfs, bin))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o755 {
			t.Errorf("/%s has mode %v, want 0755", bin, fi.Mode().Perm())
		}
	}
	for file, want := range map[string]string{
		"etc/passwd": "nonroot:x:65532:65532:",
		"etc/group":  "nonroot:x:65532:",
	} {
		b, err := os.ReadFile(filepath.Join(rootfs, file))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("/%s lacks %q:\n%s", file, want, b)
		}
	}
	pemCerts, err := os.ReadFile(filepath.Join(rootfs, "etc/ssl/certs/ca-certificates.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(pemCerts, []byte("BEGIN CERTIFICATE")); n < 100 || !x509.NewCertPool().AppendCertsFromPEM(pemCerts) {
		t.Errorf("the CA bundle holds %d certificates, want a parseable root store (over 100)", n)
	}
	fi, err := os.Stat(filepath.Join(rootfs, "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("/tmp has mode %v, want sticky 0777", fi.Mode())
	}
}

func writeOwned(t *testing.T, file string, data []byte, uid, gid uint32) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(file, int(uid), int(gid)); err != nil {
		t.Fatal(err)
	}
}

// procUID is the real uid of a running process.
func procUID(t *testing.T, pid int) uint32 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
			u, err := strconv.ParseUint(f[1], 10, 32)
			if err != nil {
				t.Fatal(err)
			}
			return uint32(u)
		}
	}
	t.Fatalf("no Uid line in /proc/%d/status", pid)
	return 0
}

// freeAddr is a loopback address with a port nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// syncBuffer collects a process's output, read while it is written.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
