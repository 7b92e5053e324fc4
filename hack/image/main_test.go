package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

var (
	amd64 = platform{os: "linux", arch: "amd64"}
	arm64 = platform{os: "linux", arch: "arm64"}
	both  = []platform{amd64, arm64}
)

// writeBinaries writes two files that stand for binaries (not Go, not
// ELF) and returns the -file flags that put them at /manager and /queenlock.
func writeBinaries(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	var add []string
	for _, name := range []string{"manager", "queenlock"} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!binary "+name), 0o700); err != nil {
			t.Fatal(err)
		}
		add = append(add, "/"+name+"="+p)
	}
	return add
}

var (
	builtMu sync.Mutex
	built   = map[string]string{}
)

// goBinary is pkg of this module built for the platform, as make image
// builds, once per test run: in a directory named OS-ARCH, so that
// DIR/{os}-{arch}/NAME names each platform's.
func goBinary(t *testing.T, pkg string, p platform) string {
	t.Helper()
	builtMu.Lock()
	defer builtMu.Unlock()
	key := pkg + " " + p.String()
	if bin, ok := built[key]; ok {
		return bin
	}
	name := filepath.Base(pkg)
	if pkg == "." {
		name = "image"
	}
	bin := filepath.Join(binDir, p.dashed(), name)
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=", "-o", bin, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.os, "GOARCH="+p.arch)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s for %s: %v\n%s", pkg, p, err, out)
	}
	built[key] = bin
	return bin
}

// binDir holds the binaries goBinary builds, for the whole test run.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "image-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// pauseOptions are make image's options for an image of ./pause (a small
// Go program) for both platforms, with SBOMs.
func pauseOptions(t *testing.T, out, sbomDir string) options {
	t.Helper()
	for _, p := range both {
		goBinary(t, "./pause", p)
	}
	return options{
		out: out, name: "example.test/pause:1", entrypoint: "/pause", platforms: both,
		files: []string{"/pause=" + filepath.Join(binDir, "{os}-{arch}", "pause")},
		sbom:  sbomDir,
	}
}

// The same inputs give the same archive and SBOMs, byte for byte, whenever
// built: the whole layout, both platforms' images, the image index, the
// SBOMs and their artifacts.
func TestReproducible(t *testing.T) {
	dir := t.TempDir()
	a := pauseOptions(t, filepath.Join(dir, "a", "image.tar"), filepath.Join(dir, "a", "sbom"))
	if err := run(a); err != nil {
		t.Fatal(err)
	}
	// Touch the inputs: their times must not matter.
	for _, p := range both {
		if err := os.Chtimes(goBinary(t, "./pause", p), time.Now(), time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	b := pauseOptions(t, filepath.Join(dir, "b", "image.tar"), filepath.Join(dir, "b", "sbom"))
	if err := run(b); err != nil {
		t.Fatal(err)
	}
	same := func(x, y string) {
		t.Helper()
		xb, err := os.ReadFile(x)
		if err != nil {
			t.Fatal(err)
		}
		yb, err := os.ReadFile(y)
		if err != nil {
			t.Fatal(err)
		}
		if len(xb) == 0 || !bytes.Equal(xb, yb) {
			t.Errorf("two builds differ: %s (%d bytes) and %s (%d bytes)", x, len(xb), y, len(yb))
		}
	}
	same(a.out, b.out)
	for _, p := range both {
		name := "pause-" + p.dashed() + ".spdx.json"
		same(filepath.Join(a.sbom, name), filepath.Join(b.sbom, name))
	}
}

// The archive is an OCI layout whose index.json names one image index,
// which holds an image per platform, with that platform in the index and
// in the image's configuration and a binary of that architecture, and an
// SBOM artifact per platform whose subject is that platform's image and
// whose layers are the SBOM files written next to the archive.
func TestIndex(t *testing.T) {
	dir := t.TempDir()
	o := pauseOptions(t, filepath.Join(dir, "image.tar"), filepath.Join(dir, "sbom"))
	if err := run(o); err != nil {
		t.Fatal(err)
	}
	layoutDir := filepath.Join(dir, "layout")
	untar(t, o.out, layoutDir)
	top, err := layout.ImageIndexFromPath(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].MediaType != types.OCIImageIndex ||
		tm.Manifests[0].Annotations["io.containerd.image.name"] != o.name ||
		tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "1" {
		t.Fatalf("index.json: %+v, want one image index named %s", tm.Manifests, o.name)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 4 {
		t.Fatalf("the image index lists %d manifests, want 2 images and 2 SBOMs: %+v", len(im.Manifests), im.Manifests)
	}
	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	for i, p := range both {
		d := im.Manifests[i]
		if d.MediaType != types.OCIManifestSchema1 || d.Platform == nil || d.Platform.OS != p.os || d.Platform.Architecture != p.arch || d.ArtifactType != "" {
			t.Errorf("manifest %d: %s platform %+v artifactType %q, want an image for %s", i, d.MediaType, d.Platform, d.ArtifactType, p)
			continue
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if err := validate.Image(img); err != nil {
			t.Errorf("%s: %v", p, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != p.os || cf.Architecture != p.arch || cf.Config.User != "65532:65532" || !slices.Equal(cf.Config.Entrypoint, []string{"/pause"}) {
			t.Errorf("%s: config os %q architecture %q user %q entrypoint %q", p, cf.OS, cf.Architecture, cf.Config.User, cf.Config.Entrypoint)
		}
		pause := fileInImage(t, img, "pause")
		want, err := os.ReadFile(goBinary(t, "./pause", p))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(pause, want) {
			t.Errorf("%s: /pause is not the %s binary given", p, p)
		}
		f, err := elf.NewFile(bytes.NewReader(pause))
		if err != nil {
			t.Fatalf("%s: /pause: %v", p, err)
		}
		if f.Machine != machines[p.arch] {
			t.Errorf("%s: /pause is for %v, want %v", p, f.Machine, machines[p.arch])
		}

		// The SBOM artifact of the platform, listed after the images.
		sd := im.Manifests[len(both)+i]
		if sd.MediaType != types.OCIManifestSchema1 || sd.ArtifactType != string(spdxMediaType) || sd.Platform != nil {
			t.Errorf("manifest %d: %s artifactType %q platform %+v, want an SBOM artifact without platform", len(both)+i, sd.MediaType, sd.ArtifactType, sd.Platform)
		}
		raw := blob(t, layoutDir, sd.Digest)
		var art v1.Manifest
		if err := json.Unmarshal(raw, &art); err != nil {
			t.Fatal(err)
		}
		if art.ArtifactType != string(spdxMediaType) || art.Subject == nil || art.Subject.Digest != d.Digest || art.Subject.Size != d.Size || art.Subject.MediaType != d.MediaType {
			t.Errorf("%s: SBOM artifact %s: artifactType %q subject %+v, want %s", p, raw, art.ArtifactType, art.Subject, d.Digest)
		}
		if art.Config.MediaType != emptyMediaType || art.Config.Size != 2 || string(blob(t, layoutDir, art.Config.Digest)) != "{}" {
			t.Errorf("%s: SBOM artifact config %+v, want the empty descriptor", p, art.Config)
		}
		title := "pause-" + p.dashed() + ".spdx.json"
		if len(art.Layers) != 1 || art.Layers[0].MediaType != spdxMediaType || art.Layers[0].Annotations["org.opencontainers.image.title"] != title {
			t.Fatalf("%s: SBOM artifact layers %+v, want one SPDX file %s", p, art.Layers, title)
		}
		doc := blob(t, layoutDir, art.Layers[0].Digest)
		file, err := os.ReadFile(filepath.Join(o.sbom, title))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(doc, file) {
			t.Errorf("%s: the SBOM in the archive is not %s", p, title)
		}
		checkSBOM(t, doc, want, "/pause", p)
	}
}

// fileInImage is the content of a file of the image's root filesystem.
func fileInImage(t *testing.T, img v1.Image, name string) []byte {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("no %s in the image", name)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == name {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

func blob(t *testing.T, layoutDir string, h v1.Hash) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(layoutDir, "blobs", h.Algorithm, h.Hex))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// module is one line of `go version -m`'s, or one SBOM package.
type module struct{ path, version, sum string }

func (m module) String() string { return strings.TrimSpace(m.path + " " + m.version + " " + m.sum) }

// goVersionM is the modules `go version -m` lists for the binary (the main
// module, each dependency as replaced, if it is), and the toolchain as the
// module "stdlib", parsed from its output, and its build settings.
func goVersionM(t *testing.T, bin string) (mods []module, settings map[string]string) {
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
	settings = map[string]string{}
	for _, line := range lines[1:] {
		f := strings.Split(strings.TrimPrefix(line, "\t"), "\t")
		for len(f) < 4 {
			f = append(f, "")
		}
		switch f[0] {
		case "mod", "dep":
			mods = append(mods, module{f[1], f[2], f[3]})
		case "=>":
			mods[len(mods)-1] = module{f[1], f[2], f[3]}
		case "build":
			k, v, _ := strings.Cut(f[1], "=")
			settings[k] = v
		}
	}
	goVersion, _, _ = strings.Cut(goVersion, " ")
	return append(mods, module{"stdlib", goVersion, ""}), settings
}

// checkSBOM checks an SPDX document against the binary it describes: the
// document's form, one package per module `go version -m` lists, exactly,
// with its version, go.sum hash and purl, and the binary's checksums.
func checkSBOM(t *testing.T, doc, bin []byte, inImage string, p platform) {
	t.Helper()
	var d spdxDocument
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s %s: SBOM: %v", inImage, p, err)
	}
	if d.SPDXVersion != "SPDX-2.3" || d.DataLicense != "CC0-1.0" || d.SPDXID != "SPDXRef-DOCUMENT" ||
		!strings.HasPrefix(d.DocumentNamespace, "https://") || len(d.CreationInfo.Creators) == 0 || d.CreationInfo.Created != "1970-01-01T00:00:00Z" {
		t.Errorf("%s %s: SBOM header %+v", inImage, p, d)
	}
	f := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(f, bin, 0o600); err != nil {
		t.Fatal(err)
	}
	want, settings := goVersionM(t, f)
	if settings["GOOS"] != p.os || settings["GOARCH"] != p.arch {
		t.Errorf("%s: built for %s/%s, want %s", inImage, settings["GOOS"], settings["GOARCH"], p)
	}
	var got []module
	ids := map[string]bool{d.SPDXID: true}
	for _, pkg := range d.Packages {
		m := module{path: pkg.Name, version: pkg.VersionInfo}
		for _, c := range pkg.Checksums {
			raw, err := hex.DecodeString(c.ChecksumValue)
			if c.Algorithm != "SHA256" || err != nil {
				t.Errorf("%s: package %s: checksum %+v", inImage, pkg.Name, c)
			}
			m.sum = "h1:" + base64.StdEncoding.EncodeToString(raw)
		}
		got = append(got, m)
		if ids[pkg.SPDXID] {
			t.Errorf("%s: SPDXID %s twice", inImage, pkg.SPDXID)
		}
		ids[pkg.SPDXID] = true
		wantPURL := goPURL(m.path, m.version)
		if m.path == "stdlib" {
			wantPURL = "pkg:golang/stdlib@" + strings.TrimPrefix(m.version, "go")
		}
		if len(pkg.ExternalRefs) != 1 || pkg.ExternalRefs[0] != (spdxExternalRef{"PACKAGE-MANAGER", "purl", wantPURL}) {
			t.Errorf("%s: package %s: externalRefs %+v, want the purl %s", inImage, pkg.Name, pkg.ExternalRefs, wantPURL)
		}
	}
	sortModules(got)
	sortModules(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s %s: the SBOM lists\n%v\ngo version -m lists\n%v", inImage, p, got, want)
	}
	if len(d.Files) != 1 || d.Files[0].FileName != "."+inImage {
		t.Fatalf("%s: SBOM files %+v", inImage, d.Files)
	}
	sums := map[string]string{}
	for _, c := range d.Files[0].Checksums {
		sums[c.Algorithm] = c.ChecksumValue
	}
	if sums["SHA256"] != sha256Hex(bin) || len(sums["SHA1"]) != 40 {
		t.Errorf("%s: the SBOM's file checksums %v are not the binary's (sha256 %s)", inImage, sums, sha256Hex(bin))
	}
	ids[d.Files[0].SPDXID] = true
	describes := 0
	for _, r := range d.Relationships {
		if !ids[r.SPDXElementID] || !ids[r.RelatedSPDXElement] {
			t.Errorf("%s: relationship %+v names an element the document lacks", inImage, r)
		}
		if r.SPDXElementID == "SPDXRef-DOCUMENT" && r.RelationshipType == "DESCRIBES" {
			describes++
		}
	}
	if describes == 0 {
		t.Errorf("%s: the SBOM DESCRIBES nothing", inImage)
	}
}

func sortModules(m []module) {
	sort.Slice(m, func(i, j int) bool { return m[i].String() < m[j].String() })
}

// The SBOM of a Go binary with dependencies, this command itself, lists
// every module `go version -m` lists, exactly, with versions and hashes.
func TestSBOMMatchesGoVersion(t *testing.T) {
	host := platform{os: "linux", arch: runtime.GOARCH}
	if runtime.GOOS != "linux" {
		t.Skip("builds a linux binary and reads it back with go version -m")
	}
	bin := goBinary(t, ".", host)
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := sbom(data, "example.test/image:1", "/image", host, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	checkSBOM(t, doc, data, "/image", host)
	mods, _ := goVersionM(t, bin)
	if len(mods) < 5 {
		t.Errorf("go version -m lists only %v: want a binary with dependencies", mods)
	}
}

func TestRefName(t *testing.T) {
	for name, want := range map[string]string{
		"ghcr.io/queen-locks/queen-locks:0.1.0": "0.1.0",
		"localhost:5000/queen-locks:dev":        "dev",
		"localhost:5000/queen-locks":            "localhost:5000/queen-locks",
		"example.test/image@sha256:0123":        "example.test/image@sha256:0123",
	} {
		if got := refName(name); got != want {
			t.Errorf("refName(%q) = %q, want %q", name, got, want)
		}
	}
}

// A replaced dependency is listed as its replacement, which is what the
// binary holds; one replaced by a directory has no purl.
func TestSBOMReplaced(t *testing.T) {
	bi := &debug.BuildInfo{
		GoVersion: "go1.26.0 X:nocoverageredesign",
		Path:      "example.test/app/cmd/app",
		Main:      debug.Module{Path: "example.test/app", Version: "v1.2.3", Sum: "h1:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="},
		Deps: []*debug.Module{
			{Path: "example.test/a", Version: "v1.0.0", Replace: &debug.Module{Path: "example.test/fork", Version: "v1.0.1", Sum: "h1:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="}},
			{Path: "example.test/b", Version: "v0.1.0", Replace: &debug.Module{Path: "../b"}},
		},
	}
	doc, err := spdxOf(bi, []byte("binary"), "example.test/app:1", "/app", amd64, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	var d spdxDocument
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range d.Packages {
		s := p.Name + " " + p.VersionInfo
		for _, c := range p.Checksums {
			s += " " + c.Algorithm + ":" + c.ChecksumValue
		}
		for _, r := range p.ExternalRefs {
			s += " " + r.ReferenceLocator
		}
		got = append(got, s)
	}
	// 47DEQ… is the base64 of the SHA-256 of nothing, e3b0c4….
	const sum = "SHA256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	want := []string{
		"example.test/app v1.2.3 " + sum + " pkg:golang/example.test/app@v1.2.3",
		"example.test/fork v1.0.1 " + sum + " pkg:golang/example.test/fork@v1.0.1",
		"../b ",
		"stdlib go1.26.0 pkg:golang/stdlib@1.26.0",
	}
	if !slices.Equal(got, want) {
		t.Errorf("packages\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if c := d.Packages[1].Comment; !strings.HasPrefix(c, "Replaces example.test/a v1.0.0.") {
		t.Errorf("the replacement's comment %q does not say what it replaces", c)
	}
}

func TestGoPURL(t *testing.T) {
	for _, c := range []struct{ path, version, want string }{
		{"github.com/queen-locks/queen-locks", "(devel)", "pkg:golang/github.com/queen-locks/queen-locks"},
		{"k8s.io/client-go", "v0.35.0", "pkg:golang/k8s.io/client-go@v0.35.0"},
		{"github.com/Azure/go-ansiterm", "v0.0.0-20250102033503-faa5f7b0171c", "pkg:golang/github.com/azure/go-ansiterm@v0.0.0-20250102033503-faa5f7b0171c"},
		{"github.com/docker/docker", "v28.0.1+incompatible", "pkg:golang/github.com/docker/docker@v28.0.1%2Bincompatible"},
		{"gopkg.in/yaml.v3", "v3.0.1", "pkg:golang/gopkg.in/yaml.v3@v3.0.1"},
		{"../local", "", ""},
	} {
		if got := goPURL(c.path, c.version); got != c.want {
			t.Errorf("goPURL(%q, %q) = %q, want %q", c.path, c.version, got, c.want)
		}
	}
}

// One platform's archive holds the binaries, the user and the entrypoint;
// -rootfs writes the very same files.
func TestArchiveAndRootFS(t *testing.T) {
	add := writeBinaries(t)
	dir := t.TempDir()
	archive := filepath.Join(dir, "image.tar")
	if err := run(options{out: archive, name: "example.test/queen-locks:1", entrypoint: "/manager", platforms: []platform{amd64}, files: add}); err != nil {
		t.Fatal(err)
	}
	layoutDir := filepath.Join(dir, "layout")
	untar(t, archive, layoutDir)
	top, err := layout.ImageIndexFromPath(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].Annotations["io.containerd.image.name"] != "example.test/queen-locks:1" {
		t.Fatalf("index.json: %+v", tm.Manifests)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("image index: %+v, want one image and no SBOM", m.Manifests)
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/manager" || cf.Architecture != "amd64" {
		t.Errorf("config: user %q entrypoint %q arch %q", cf.Config.User, cf.Config.Entrypoint, cf.Architecture)
	}
	var inImage []string
	tr := tar.NewReader(mutate.Extract(img))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		inImage = append(inImage, "/"+strings.TrimSuffix(h.Name, "/"))
		if h.Name == "manager" && h.Mode != 0o755 {
			t.Errorf("/manager mode %o, want 755", h.Mode)
		}
		if h.Name == "home/nonroot/" && (h.Uid != 65532 || h.Gid != 65532) {
			t.Errorf("/home/nonroot owned by %d:%d, want 65532:65532", h.Uid, h.Gid)
		}
	}
	for _, want := range []string{"/manager", "/queenlock", "/etc/passwd", "/etc/group", "/etc/ssl/certs/ca-certificates.crt", "/tmp"} {
		if !slices.Contains(inImage, want) {
			t.Errorf("the image lacks %s; it has %v", want, inImage)
		}
	}

	rootfs := filepath.Join(dir, "rootfs")
	if err := run(options{rootfs: rootfs, files: add}); err != nil {
		t.Fatal(err)
	}
	var inDir []string
	err = filepath.WalkDir(rootfs, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == rootfs {
			return err
		}
		inDir = append(inDir, strings.TrimPrefix(p, rootfs))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(inImage)
	sort.Strings(inDir)
	if strings.Join(inImage, " ") != strings.Join(inDir, " ") {
		t.Errorf("-rootfs wrote\n%v\nthe image holds\n%v", inDir, inImage)
	}
}

func TestBadFile(t *testing.T) {
	for _, add := range [][]string{{"manager=/x"}, {"/bin/manager=/x"}, {"/manager"}, {"/etc=/x"}} {
		if err := run(options{out: filepath.Join(t.TempDir(), "x.tar"), name: "n:1", entrypoint: "/manager", files: add}); err == nil {
			t.Errorf("-file %q: no error", add)
		}
	}
}

// What must not give an image: a binary of the wrong architecture for a
// platform, an SBOM of what is no Go binary, -rootfs of two platforms,
// platforms that are not OS/ARCH.
func TestRefused(t *testing.T) {
	dir := t.TempDir()
	amd64Pause := goBinary(t, "./pause", amd64)
	for name, o := range map[string]options{
		"an amd64 binary for arm64": {files: []string{"/pause=" + amd64Pause}, platforms: both},
		"an SBOM of no Go binary":   {files: writeBinaries(t), platforms: []platform{amd64}, sbom: filepath.Join(dir, "sbom")},
	} {
		o.out, o.name, o.entrypoint = filepath.Join(dir, "x.tar"), "n:1", strings.SplitN(o.files[0], "=", 2)[0]
		if err := run(o); err == nil {
			t.Errorf("%s: no error", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if err := run(options{rootfs: filepath.Join(dir, "rootfs"), platforms: both, files: writeBinaries(t)}); err == nil {
		t.Errorf("-rootfs of two platforms: no error")
	}
	for _, s := range []string{"linux", "linux/", "/amd64", "linux/amd64,linux/amd64", "linux/arm/v7/x"} {
		if _, err := parsePlatforms(s); err == nil {
			t.Errorf("-platforms %q: no error", s)
		}
	}
	if ps, err := parsePlatforms("linux/amd64,linux/arm64,linux/arm/v7"); err != nil || len(ps) != 3 || ps[2].variant != "v7" || ps[2].dashed() != "linux-arm-v7" {
		t.Errorf("-platforms linux/amd64,linux/arm64,linux/arm/v7: %+v, %v", ps, err)
	}
}

func untar(t *testing.T, file, dir string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
