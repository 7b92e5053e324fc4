// Command image builds a container image from static binaries without a
// Docker engine: an empty base, plus what a static Go program needs to run
// as the non-root user 65532 (/etc/passwd and /etc/group entries, CA
// certificates, a writable /tmp), plus the binaries. It writes an OCI
// archive (an OCI image layout in a tar file, which `ctr images import`,
// `skopeo copy oci-archive:` and `crane` read) whose index.json names one
// OCI image index, holding one image per platform (-platforms) and, with
// -sbom, an SPDX SBOM per binary per platform. With -rootfs it writes the
// same files as one platform's image into a directory instead, which the
// Dockerfile copies onto scratch so that both ways give the same contents.
//
// The SBOMs are SPDX 2.3 JSON documents made from each Go binary's
// embedded build information (what `go version -m` prints): one package
// per module, with its version, its go.sum hash and a purl, and the Go
// toolchain. They are written into the -sbom directory as
// NAME-OS-ARCH.spdx.json, and attached in the archive as OCI 1.1
// artifacts: per platform one manifest of artifactType
// application/spdx+json, one layer per binary, whose subject is that
// platform's image manifest. The image index lists them after the images,
// without a platform, so that a runtime choosing its platform never picks
// them, while `oras discover` and registries that serve referrers see them
// as the image's referrers. docs/image.md shows how to check both.
//
// The output depends only on its inputs: every file has owner, mode and
// mtime fixed (SOURCE_DATE_EPOCH, else 0), entries are sorted, the CA
// certificates come from the pinned golang.org/x/crypto/x509roots/fallback
// module rather than from the machine, and the SBOMs carry no random
// identifiers or clock times.
//
//	go run . -out image.tar -name ghcr.io/queen-locks/queen-locks:0.1.0 \
//	    -platforms linux/amd64,linux/arm64 -sbom sbom -entrypoint /manager \
//	    -file '/manager=bin/{os}-{arch}/manager' -file '/queenlock=bin/{os}-{arch}/queenlock'
package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// The non-root user the image runs as, as in distroless's "nonroot".
const (
	uid  = 65532
	user = "nonroot"
)

// Media types of the SBOM artifacts (OCI image spec 1.1).
const (
	spdxMediaType  types.MediaType = "application/spdx+json"
	emptyMediaType types.MediaType = "application/vnd.oci.empty.v1+json"
)

// entry is one file or directory of the image's root filesystem.
type entry struct {
	name     string // absolute path in the image
	mode     fs.FileMode
	uid, gid int
	data     []byte // nil for a directory
}

type files []string

func (f *files) String() string     { return strings.Join(*f, ",") }
func (f *files) Set(v string) error { *f = append(*f, v); return nil }

// options are the command line's.
type options struct {
	out, rootfs string
	name        string
	entrypoint  string
	platforms   []platform
	files       []string // PATH=SOURCE, SOURCE with {os}, {arch}, {variant}
	sbom        string   // directory for the SBOM files; "" for none
}

func main() {
	var (
		o         options
		platforms string
		add       files
	)
	flag.StringVar(&o.out, "out", "", "OCI archive to write.")
	flag.StringVar(&o.rootfs, "rootfs", "", "Directory to write the root filesystem into instead of an archive (for the Dockerfile; one platform).")
	flag.StringVar(&o.name, "name", "", "Image reference recorded in the archive (what `ctr images import` names it).")
	flag.StringVar(&o.entrypoint, "entrypoint", "", "Entrypoint: the path of a binary in the image.")
	flag.StringVar(&platforms, "platforms", "linux/"+runtime.GOARCH, "Comma-separated OS/ARCH[/VARIANT] the image index holds an image for, in this order.")
	flag.StringVar(&o.sbom, "sbom", "", "Directory to write an SPDX 2.3 SBOM of every -file of every platform into (NAME-OS-ARCH.spdx.json); they are attached to the archive too. Every -file must then be a Go binary.")
	flag.Var(&add, "file", "PATH=SOURCE: put the file SOURCE at PATH in the image, mode 0755 (repeatable). {os}, {arch} and {variant} in SOURCE stand for each platform's.")
	flag.Parse()
	var err error
	if o.platforms, err = parsePlatforms(platforms); err == nil {
		o.files = add
		err = run(o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// platform is one OS/ARCH[/VARIANT] of the image index.
type platform struct{ os, arch, variant string }

func parsePlatforms(s string) ([]platform, error) {
	var ps []platform
	seen := map[platform]bool{}
	for _, f := range strings.Split(s, ",") {
		parts := strings.Split(strings.TrimSpace(f), "/")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
			return nil, fmt.Errorf("-platforms: %q is not OS/ARCH[/VARIANT]", f)
		}
		p := platform{os: parts[0], arch: parts[1]}
		if len(parts) == 3 {
			p.variant = parts[2]
		}
		if seen[p] {
			return nil, fmt.Errorf("-platforms: %s given twice", p)
		}
		seen[p] = true
		ps = append(ps, p)
	}
	return ps, nil
}

func (p platform) String() string {
	if p.variant != "" {
		return p.os + "/" + p.arch + "/" + p.variant
	}
	return p.os + "/" + p.arch
}

// dashed is the platform in a file name: linux-amd64, linux-arm-v7.
func (p platform) dashed() string { return strings.ReplaceAll(p.String(), "/", "-") }

func (p platform) v1() *v1.Platform {
	return &v1.Platform{OS: p.os, Architecture: p.arch, Variant: p.variant}
}

// expand is a -file's SOURCE for this platform.
func (p platform) expand(source string) string {
	return strings.NewReplacer("{os}", p.os, "{arch}", p.arch, "{variant}", p.variant).Replace(source)
}

// elfMachines are the ELF machines of the Go architectures a platform may
// name; a binary for another one is refused.
var elfMachines = map[string]elf.Machine{
	"386":     elf.EM_386,
	"amd64":   elf.EM_X86_64,
	"arm":     elf.EM_ARM,
	"arm64":   elf.EM_AARCH64,
	"ppc64le": elf.EM_PPC64,
	"riscv64": elf.EM_RISCV,
	"s390x":   elf.EM_S390,
}

// checkMachine refuses an ELF file built for another architecture than
// the platform's; other files (scripts, data) pass.
func checkMachine(data []byte, p platform) error {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return nil //nolint:nilerr // not an ELF file: nothing to check
	}
	if want, ok := elfMachines[p.arch]; ok && f.Machine != want {
		return fmt.Errorf("is an ELF file for %v, not for %s", f.Machine, p)
	}
	return nil
}

func run(o options) error {
	if (o.out == "") == (o.rootfs == "") {
		return errors.New("give exactly one of -out and -rootfs")
	}
	if len(o.platforms) == 0 {
		o.platforms = []platform{{os: "linux", arch: runtime.GOARCH}}
	}
	mtime, err := sourceDate()
	if err != nil {
		return err
	}
	if o.rootfs != "" {
		if len(o.platforms) != 1 || o.sbom != "" {
			return errors.New("-rootfs writes one platform's files, without -sbom")
		}
		entries, err := rootFS(o.files, o.platforms[0])
		if err != nil {
			return err
		}
		return writeDir(o.rootfs, entries)
	}
	if o.name == "" {
		return errors.New("-name is required with -out")
	}
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	l := newLayout()
	var images, sboms []v1.Descriptor
	for _, p := range o.platforms {
		entries, err := rootFS(o.files, p)
		if err != nil {
			return err
		}
		if !hasFile(entries, o.entrypoint) {
			return fmt.Errorf("-entrypoint %q is not a file given with -file", o.entrypoint)
		}
		manifest, err := l.addImage(entries, o.entrypoint, p, mtime)
		if err != nil {
			return err
		}
		images = append(images, manifest)
		if o.sbom == "" {
			continue
		}
		sbom, err := l.addSBOMs(o.sbom, o.name, entries, o.files, manifest, p, mtime)
		if err != nil {
			return err
		}
		sboms = append(sboms, sbom)
	}
	index, err := l.addJSON(types.OCIImageIndex, v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests:     append(images, sboms...),
	})
	if err != nil {
		return err
	}
	// containerd names an imported image from io.containerd.image.name;
	// other tools (skopeo's oci-archive:FILE:TAG, oras's --oci-layout
	// DIR:TAG) find it by the OCI ref.name, which is the tag, as BuildKit
	// writes it.
	index.Annotations = map[string]string{
		"io.containerd.image.name":          o.name,
		"org.opencontainers.image.ref.name": refName(o.name),
	}
	return l.write(o.out, index, mtime)
}

// refName is the OCI ref.name of an image reference in an image layout:
// its tag (0.1.0 of ghcr.io/queen-locks/queen-locks:0.1.0), or the whole
// reference when it has no tag.
func refName(name string) string {
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") && !strings.Contains(name, "@") {
		return name[i+1:]
	}
	return name
}

// sourceDate is the time stamped on every file and on the image, from
// SOURCE_DATE_EPOCH as reproducible builds define it.
func sourceDate() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	sec, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q is not a whole number of seconds", s)
	}
	return time.Unix(sec, 0).UTC(), nil
}

// rootFS is the platform's image's whole root filesystem, sorted by path.
func rootFS(add []string, p platform) ([]entry, error) {
	dir := func(name string, mode fs.FileMode, owner int) entry {
		return entry{name: name, mode: fs.ModeDir | mode, uid: owner, gid: owner}
	}
	file := func(name string, data []byte) entry {
		return entry{name: name, mode: 0o644, data: data}
	}
	certs, err := caCertificates()
	if err != nil {
		return nil, err
	}
	entries := []entry{
		dir("/etc", 0o755, 0),
		file("/etc/passwd", []byte("root:x:0:0:root:/root:/sbin/nologin\n"+
			fmt.Sprintf("%s:x:%d:%d:%s:/home/%s:/sbin/nologin\n", user, uid, uid, user, user))),
		file("/etc/group", []byte(fmt.Sprintf("root:x:0:\n%s:x:%d:\n", user, uid))),
		// Go reads the host lookup order here: /etc/hosts (where a pod's
		// hostAliases go) before DNS.
		file("/etc/nsswitch.conf", []byte("hosts: files dns\n")),
		dir("/etc/ssl", 0o755, 0),
		dir("/etc/ssl/certs", 0o755, 0),
		file("/etc/ssl/certs/ca-certificates.crt", certs),
		dir("/home", 0o755, 0),
		dir("/home/"+user, 0o700, uid),
		dir("/tmp", fs.ModeSticky|0o777, 0),
	}
	seen := map[string]bool{}
	for _, e := range entries {
		seen[e.name] = true
	}
	for _, a := range add {
		dst, src, ok := strings.Cut(a, "=")
		if !ok || !path.IsAbs(dst) || path.Clean(dst) != dst || path.Dir(dst) != "/" {
			return nil, fmt.Errorf("-file %q: want /NAME=SOURCE, a file at the image's root", a)
		}
		if seen[dst] {
			return nil, fmt.Errorf("-file %q: %s is already in the image", a, dst)
		}
		seen[dst] = true
		data, err := os.ReadFile(p.expand(src))
		if err != nil {
			return nil, fmt.Errorf("-file %q: %w", a, err)
		}
		if err := checkMachine(data, p); err != nil {
			return nil, fmt.Errorf("-file %q: %s %w", a, p.expand(src), err)
		}
		entries = append(entries, entry{name: dst, mode: 0o755, data: data})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	return entries, nil
}

// caCertificates is the Mozilla root store as a PEM bundle, from the pinned
// fallback module. Roots that carry a constraint PEM cannot express (trust
// only for certificates issued before a date) are left out, as Debian's
// ca-certificates leaves distrusted roots out.
func caCertificates() ([]byte, error) {
	var b bytes.Buffer
	for root := range bundle.Roots() {
		if root.Constraint != nil {
			continue
		}
		if err := pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: root.Certificate}); err != nil {
			return nil, err
		}
	}
	if b.Len() == 0 {
		return nil, errors.New("the CA bundle is empty")
	}
	return b.Bytes(), nil
}

func hasFile(entries []entry, name string) bool {
	for _, e := range entries {
		if e.name == name && e.data != nil {
			return true
		}
	}
	return false
}

// tarEntries is the layer: entries in order, owner, mode and time fixed.
func tarEntries(entries []entry, mtime time.Time) ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{
			Name:    strings.TrimPrefix(e.name, "/"),
			Mode:    int64(e.mode.Perm()),
			Uid:     e.uid,
			Gid:     e.gid,
			ModTime: mtime,
			Format:  tar.FormatPAX,
		}
		if e.mode&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		if e.data == nil {
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// ociLayout is an OCI image layout being built in memory: its blobs by
// sha256 in hex.
type ociLayout struct{ blobs map[string][]byte }

func newLayout() *ociLayout { return &ociLayout{blobs: map[string][]byte{}} }

// add stores a blob and describes it.
func (l *ociLayout) add(mediaType types.MediaType, data []byte) v1.Descriptor {
	sum := sha256.Sum256(data)
	h := hex.EncodeToString(sum[:])
	l.blobs[h] = data
	return v1.Descriptor{MediaType: mediaType, Size: int64(len(data)), Digest: v1.Hash{Algorithm: "sha256", Hex: h}}
}

func (l *ociLayout) addJSON(mediaType types.MediaType, v any) (v1.Descriptor, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return v1.Descriptor{}, err
	}
	return l.add(mediaType, b), nil
}

// addImage stores one platform's image: one layer of the entries, and the
// configuration that runs the entrypoint as the user. It returns the
// descriptor of its manifest, with the platform, for the image index.
func (l *ociLayout) addImage(entries []entry, entrypoint string, p platform, mtime time.Time) (v1.Descriptor, error) {
	layerTar, err := tarEntries(entries, mtime)
	if err != nil {
		return v1.Descriptor{}, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return v1.Descriptor{}, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if img, err = mutate.AppendLayers(img, layer); err != nil {
		return v1.Descriptor{}, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return v1.Descriptor{}, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.os, p.arch, p.variant
	cf.Created = v1.Time{Time: mtime}
	cf.Config = v1.Config{
		Entrypoint: []string{entrypoint},
		User:       fmt.Sprintf("%d:%d", uid, uid),
		WorkingDir: "/",
		Env:        []string{"PATH=/", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return v1.Descriptor{}, err
	}
	layers, err := img.Layers()
	if err != nil {
		return v1.Descriptor{}, err
	}
	for _, layer := range layers {
		rc, err := layer.Compressed()
		if err != nil {
			return v1.Descriptor{}, err
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return v1.Descriptor{}, err
		}
		want, err := layer.Digest()
		if err != nil {
			return v1.Descriptor{}, err
		}
		if d := l.add(types.OCILayer, b); d.Digest != want {
			return v1.Descriptor{}, fmt.Errorf("layer compressed to %s, then to %s", want, d.Digest)
		}
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return v1.Descriptor{}, err
	}
	l.add(types.OCIConfigJSON, config)
	manifest, err := img.RawManifest()
	if err != nil {
		return v1.Descriptor{}, err
	}
	d := l.add(types.OCIManifestSchema1, manifest)
	d.Platform = p.v1()
	return d, nil
}

// addSBOMs writes the SPDX SBOM of every -file of the platform into dir
// and stores them as one artifact whose subject is the platform's image
// manifest. It returns the artifact manifest's descriptor for the index.
func (l *ociLayout) addSBOMs(dir, imageName string, entries []entry, add []string, image v1.Descriptor, p platform, mtime time.Time) (v1.Descriptor, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return v1.Descriptor{}, err
	}
	artifact := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  string(spdxMediaType),
		Annotations:   map[string]string{"org.opencontainers.image.created": mtime.Format(time.RFC3339)},
	}
	// The empty config of an artifact, {} (OCI image spec 1.1).
	artifact.Config = l.add(emptyMediaType, []byte("{}"))
	artifact.Config.Data = []byte("{}")
	for _, a := range add {
		inImage, _, _ := strings.Cut(a, "=")
		var data []byte
		for _, e := range entries {
			if e.name == inImage {
				data = e.data
			}
		}
		file := path.Base(inImage) + "-" + p.dashed() + ".spdx.json"
		doc, err := sbom(data, imageName, inImage, p, mtime)
		if err != nil {
			return v1.Descriptor{}, fmt.Errorf("-file %q for %s: %w", a, p, err)
		}
		if err := writeAtomic(filepath.Join(dir, file), func(w io.Writer) error {
			_, err := w.Write(doc)
			return err
		}); err != nil {
			return v1.Descriptor{}, err
		}
		d := l.add(spdxMediaType, doc)
		d.Annotations = map[string]string{"org.opencontainers.image.title": file}
		artifact.Layers = append(artifact.Layers, d)
	}
	subject := image
	subject.Platform = nil
	artifact.Subject = &subject
	d, err := l.addJSON(types.OCIManifestSchema1, artifact)
	if err != nil {
		return v1.Descriptor{}, err
	}
	d.ArtifactType = artifact.ArtifactType
	return d, nil
}

// write writes the layout, index.json naming index, as a tar file: in
// sorted order with fixed owners, modes and times, atomically.
func (l *ociLayout) write(out string, index v1.Descriptor, mtime time.Time) error {
	top, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests:     []v1.Descriptor{index},
	})
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"index.json": top,
		"oci-layout": []byte(`{"imageLayoutVersion":"1.0.0"}`),
	}
	for h, b := range l.blobs {
		files["blobs/sha256/"+h] = b
	}
	names := []string{"blobs/", "blobs/sha256/"}
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	return writeAtomic(out, func(w io.Writer) error {
		tw := tar.NewWriter(w)
		for _, name := range names {
			h := &tar.Header{Name: name, ModTime: mtime, Mode: 0o644, Format: tar.FormatPAX}
			data, isFile := files[name]
			if !isFile {
				h.Typeflag, h.Mode = tar.TypeDir, 0o755
			} else {
				h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
			}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if _, err := tw.Write(data); err != nil {
				return err
			}
		}
		return tw.Close()
	})
}

// writeAtomic writes the file, mode 0644, through a temporary file in the
// same directory, so that a reader never sees half of it.
func writeAtomic(file string, write func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	bw := bufio.NewWriter(f)
	if err := write(bw); err != nil {
		f.Close()
		return err
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(f.Name(), file)
}

// writeDir writes the entries under dir, with their owners and modes, for
// the Dockerfile to copy onto scratch.
func writeDir(dir string, entries []entry) error {
	for _, e := range entries {
		p := filepath.Join(dir, filepath.FromSlash(e.name))
		if e.data == nil {
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		} else if err := os.WriteFile(p, e.data, 0o644); err != nil {
			return err
		}
		if err := os.Chmod(p, e.mode); err != nil {
			return err
		}
		if os.Geteuid() == 0 {
			if err := os.Lchown(p, e.uid, e.gid); err != nil {
				return err
			}
		}
	}
	return nil
}
