// Package image tests the manager image make image writes, without a
// container runtime: the image index holds an image per platform, with the
// right architecture in the index, the configurations and the binaries'
// ELF headers, and an SPDX SBOM per binary that lists exactly the modules
// `go version -m` lists; then, for each platform, it unpacks the image's
// root filesystem and runs the entrypoint in it (chroot) as the image's
// user, against the local control plane, as a runtime would start it: the
// machine's own platform natively, the others under qemu-user-static.
package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"debug/elf"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
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
	"github.com/queen-locks/queen-locks/test/internal/loopback"
)

// leaseName is the manager's leader election Lease.
const leaseName = "queen-locks-expiry.locks.queen.dev"

// platforms are the images the index must hold, in its order.
var platforms = []string{"linux/amd64", "linux/arm64"}

// binaries are the image's programs, each with an SBOM.
var binaries = []string{"manager", "queenlock"}

// machines are the ELF machines of the platforms' architectures, and
// qemuArch qemu-user's names of them.
var (
	machines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	qemuArch = map[string]string{"amd64": "x86_64", "arm64": "aarch64"}
)

const spdxMediaType = "application/spdx+json"

func TestImage(t *testing.T) {
	archive := os.Getenv("QUEEN_LOCKS_IMAGE")
	if archive == "" {
		t.Skip("QUEEN_LOCKS_IMAGE names no archive; make image-test builds one and sets it")
	}
	if os.Geteuid() != 0 {
		t.Skip("running the entrypoint in the image's root filesystem as its user takes root (chroot, setuid)")
	}
	a, err := oci.ReadArchive(archive)
	if err != nil {
		t.Fatal(err)
	}
	checkIndex(t, a)

	env, err := controlplane.Start(controlplane.Options{NoManager: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	for _, img := range a.Images {
		t.Run(img.Platform.String(), platformTest(a, img, env))
	}
}

// checkIndex checks the archive's image index: one image per platform,
// with the index's platform in its configuration, and one SBOM artifact
// per image.
func checkIndex(t *testing.T, a *oci.Archive) {
	t.Helper()
	if a.Index == "" || a.Name == "" {
		t.Fatalf("the archive's index.json names %q, %q: want a named image index", a.Name, a.Index)
	}
	var got []string
	for _, img := range a.Images {
		got = append(got, img.Platform.String())
		c := img.Config
		if c.OS != img.Platform.OS || c.Architecture != img.Platform.Architecture || c.Variant != img.Platform.Variant {
			t.Errorf("the index lists %s for %s, whose configuration says %s/%s", img.Digest, img.Platform, c.OS, c.Architecture)
		}
		if refs := a.Referrers(img.Digest); len(refs) != 1 || refs[0].ArtifactType != spdxMediaType {
			t.Errorf("%s: %d artifacts refer to the image, want one SBOM (%s)", img.Platform, len(refs), spdxMediaType)
		}
	}
	if !slices.Equal(got, platforms) {
		t.Fatalf("the image index holds images for %v, want %v", got, platforms)
	}
	if len(a.Artifacts) != len(a.Images) {
		t.Errorf("the image index lists %d artifacts, want an SBOM per image", len(a.Artifacts))
	}
}

// platformTest checks one platform's image: its files, binaries and
// SBOMs, then runs its entrypoint and CLI against the control plane.
func platformTest(a *oci.Archive, img *oci.Image, env *controlplane.Env) func(*testing.T) {
	return func(t *testing.T) {
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
		checkBinaries(t, rootfs, img.Platform)
		checkSBOMs(t, a, img, rootfs)
		if t.Failed() {
			return
		}

		interp := emulator(t, rootfs, img.Platform)
		ns := env.Namespace(t, "image-"+img.Platform.Architecture)

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

		routeAddr, probeAddr := loopback.FreeAddrT(t), loopback.FreeAddrT(t)
		logs := &syncBuffer{}
		mgr := inImage(rootfs, uid, gid, cfg.Config.Env, interp, cfg.Config.Entrypoint[0],
			"--webhook-host", wo.LocalServingHost, "--webhook-port", strconv.Itoa(wo.LocalServingPort), "--webhook-cert-dir", "/tmp/certs",
			"--route-address", routeAddr, "--auth", "none", "--default-namespace", ns,
			"--leader-elect", "--leader-election-namespace", ns,
			"--metrics-bind-address", "0", "--health-probe-bind-address", probeAddr)
		mgr.Stdout, mgr.Stderr = logs, logs
		started := time.Now()
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

		// Emulated, everything is slower.
		timeout := 2 * time.Minute
		if interp != "" {
			timeout = 5 * time.Minute
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
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
		t.Logf("%s: ready %s after start", img.Platform, time.Since(started).Round(time.Millisecond))

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
		cli := inImage(rootfs, uid, gid, cfg.Config.Env, interp, "/queenlock", "get", "image-test", "--server", "http://"+routeAddr)
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
}

// emulator is how this machine runs the platform's binaries: "" when it
// is this machine's own, else qemu-user's static emulator, put into the
// root filesystem so that it runs them in the chroot, as binfmt_misc
// would. Without a working one the test skips, saying why.
func emulator(t *testing.T, rootfs string, p oci.Platform) string {
	t.Helper()
	if p.OS == runtime.GOOS && p.Architecture == runtime.GOARCH {
		return ""
	}
	name := "qemu-" + qemuArch[p.Architecture] + "-static"
	if qemuArch[p.Architecture] == "" || p.OS != "linux" || runtime.GOOS != "linux" {
		t.Skipf("no qemu-user emulator for %s on this %s/%s machine: its entrypoint is not run (its files, binaries and SBOMs are checked)", p, runtime.GOOS, runtime.GOARCH)
	}
	qemu, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s is not installed (Debian's qemu-user-static; hack/handles/qemu.sh installs it): the %s entrypoint cannot run on this %s/%s machine; its files, binaries and SBOMs were checked", name, p, runtime.GOOS, runtime.GOARCH)
	}
	if out, err := exec.Command(qemu, "--version").CombinedOutput(); err != nil {
		t.Skipf("%s does not run here (%v: %s): the %s entrypoint cannot run on this %s/%s machine; its files, binaries and SBOMs were checked", qemu, err, bytes.TrimSpace(out), p, runtime.GOOS, runtime.GOARCH)
	}
	b, err := os.ReadFile(qemu)
	if err != nil {
		t.Fatal(err)
	}
	inRoot := "/." + name
	if err := os.WriteFile(filepath.Join(rootfs, inRoot), b, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s runs under %s (qemu-user, run explicitly: binfmt_misc is not needed)", p, name)
	return inRoot
}

// checkBinaries checks that the image's binaries are ELF files for the
// platform's machine.
func checkBinaries(t *testing.T, rootfs string, p oci.Platform) {
	t.Helper()
	want, ok := machines[p.Architecture]
	if !ok {
		t.Fatalf("no ELF machine known for %s", p)
	}
	for _, bin := range binaries {
		f, err := elf.Open(filepath.Join(rootfs, bin))
		if err != nil {
			t.Fatalf("/%s: %v", bin, err)
		}
		if f.Machine != want || f.Class != elf.ELFCLASS64 {
			t.Errorf("/%s of the %s image is a %v %v binary, want %v", bin, p, f.Class, f.Machine, want)
		}
		f.Close()
	}
}

type checksum struct {
	Algorithm     string `json:"algorithm"`
	ChecksumValue string `json:"checksumValue"`
}

// spdx is the part of an SPDX 2.3 document the test reads.
type spdx struct {
	SPDXVersion string `json:"spdxVersion"`
	Packages    []struct {
		Name         string     `json:"name"`
		VersionInfo  string     `json:"versionInfo"`
		Checksums    []checksum `json:"checksums"`
		ExternalRefs []struct {
			ReferenceType    string `json:"referenceType"`
			ReferenceLocator string `json:"referenceLocator"`
		} `json:"externalRefs"`
	} `json:"packages"`
	Files []struct {
		FileName  string     `json:"fileName"`
		Checksums []checksum `json:"checksums"`
	} `json:"files"`
}

// checkSBOMs checks the platform's SBOM artifact: one SPDX document per
// binary, the same as the file make image wrote next to the archive
// (QUEEN_LOCKS_IMAGE_SBOM), listing exactly the modules `go version -m`
// lists for the binary in the image, each with a purl, and the binary's
// checksum.
func checkSBOMs(t *testing.T, a *oci.Archive, img *oci.Image, rootfs string) {
	t.Helper()
	refs := a.Referrers(img.Digest)
	if len(refs) != 1 {
		t.Fatalf("%d artifacts refer to the %s image, want one SBOM", len(refs), img.Platform)
	}
	art := refs[0]
	var want, got []string
	for _, bin := range binaries {
		want = append(want, bin+"-"+strings.ReplaceAll(img.Platform.String(), "/", "-")+".spdx.json")
	}
	for name := range art.Files {
		got = append(got, name)
	}
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Fatalf("the %s SBOM artifact holds %v, want %v", img.Platform, got, want)
	}
	dir := os.Getenv("QUEEN_LOCKS_IMAGE_SBOM")
	for i, bin := range binaries {
		doc := art.Files[want[i]]
		if dir != "" {
			file, err := os.ReadFile(filepath.Join(dir, want[i]))
			if err != nil {
				t.Error(err)
			} else if !bytes.Equal(file, doc) {
				t.Errorf("%s differs from the SBOM in the archive", filepath.Join(dir, want[i]))
			}
		}
		var d spdx
		if err := json.Unmarshal(doc, &d); err != nil || d.SPDXVersion != "SPDX-2.3" {
			t.Fatalf("%s: not an SPDX 2.3 document (%v)", want[i], err)
		}
		var listed []string
		for _, p := range d.Packages {
			m := p.Name + " " + p.VersionInfo
			for _, c := range p.Checksums {
				raw, err := hex.DecodeString(c.ChecksumValue)
				if c.Algorithm != "SHA256" || err != nil {
					t.Errorf("%s: package %s: checksum %s %s", want[i], p.Name, c.Algorithm, c.ChecksumValue)
				}
				m += " h1:" + base64.StdEncoding.EncodeToString(raw)
			}
			if len(p.ExternalRefs) != 1 || p.ExternalRefs[0].ReferenceType != "purl" || !strings.HasPrefix(p.ExternalRefs[0].ReferenceLocator, "pkg:golang/") {
				t.Errorf("%s: package %s has no purl: %+v", want[i], p.Name, p.ExternalRefs)
			}
			listed = append(listed, m)
		}
		binary := filepath.Join(rootfs, bin)
		modules := goVersionM(t, binary)
		sort.Strings(listed)
		if !slices.Equal(listed, modules) {
			t.Errorf("%s lists\n%s\ngo version -m lists for the image's /%s\n%s", want[i], strings.Join(listed, "\n"), bin, strings.Join(modules, "\n"))
		}
		data, err := os.ReadFile(binary)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		if len(d.Files) != 1 || d.Files[0].FileName != "./"+bin || !slices.Contains(d.Files[0].Checksums, checksum{"SHA256", hex.EncodeToString(sum[:])}) {
			t.Errorf("%s does not give the SHA256 of the image's /%s (%x): %+v", want[i], bin, sum, d.Files)
		}
	}
}

// goVersionM is what `go version -m` lists for the binary, as "PATH
// VERSION [SUM]" sorted: the main module, each dependency (as replaced, if
// it is), and the toolchain as "stdlib goX.Y.Z".
func goVersionM(t *testing.T, bin string) []string {
	t.Helper()
	out, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatalf("go version -m %s: %v", bin, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	_, goVersion, ok := strings.Cut(lines[0], ": ")
	if !ok {
		t.Fatalf("go version -m %s: first line %q", bin, lines[0])
	}
	goVersion, _, _ = strings.Cut(goVersion, " ")
	var mods []string
	for _, line := range lines[1:] {
		f := strings.Split(strings.TrimPrefix(line, "\t"), "\t")
		if len(f) < 3 {
			continue
		}
		m := strings.TrimSpace(strings.Join(f[1:], " "))
		switch f[0] {
		case "mod", "dep":
			mods = append(mods, m)
		case "=>":
			mods[len(mods)-1] = m
		}
	}
	mods = append(mods, "stdlib "+goVersion)
	sort.Strings(mods)
	return mods
}

// inImage is a command run from the image's root filesystem as its user,
// with the image's environment and nothing of the test's; by the emulator
// interp (a path in the root filesystem) unless that is "".
func inImage(rootfs string, uid, gid uint32, env []string, interp, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Path = name // resolved inside the chroot, not on this machine's PATH
	if interp != "" {
		// qemu-user runs the program named after it, with that as argv[0].
		cmd.Path, cmd.Args = interp, append([]string{interp}, cmd.Args...)
	}
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
