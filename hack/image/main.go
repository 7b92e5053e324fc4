// Command image builds a container image from static binaries without a
// Docker engine: an empty base, plus what a static Go program needs to run
// as the non-root user 65532 (/etc/passwd and /etc/group entries, CA
// certificates, a writable /tmp), plus the binaries. It writes the image as
// an OCI archive (an OCI image layout in a tar file, which `ctr images
// import` and `skopeo copy oci-archive:` read), or, with -rootfs, the same
// files into a directory, which the Dockerfile copies onto scratch so that
// both ways give the same contents.
//
// The output depends only on its inputs: every file has owner, mode and
// mtime fixed (SOURCE_DATE_EPOCH, else 0), entries are sorted, and the CA
// certificates come from the pinned golang.org/x/crypto/x509roots/fallback
// module rather than from the machine.
//
//	go run . -out image.tar -name ghcr.io/queen-locks/queen-locks:0.1.0 \
//	    -entrypoint /manager -file /manager=bin/manager -file /queenlock=bin/queenlock
package main

import (
	"archive/tar"
	"bytes"
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
	"github.com/google/go-containerregistry/pkg/v1/layout"
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

func main() {
	var (
		out        = flag.String("out", "", "OCI archive to write.")
		rootfs     = flag.String("rootfs", "", "Directory to write the root filesystem into instead of an archive (for the Dockerfile).")
		name       = flag.String("name", "", "Image reference recorded in the archive (what `ctr images import` names it).")
		entrypoint = flag.String("entrypoint", "", "Entrypoint: the path of a binary in the image.")
		arch       = flag.String("arch", runtime.GOARCH, "Architecture the binaries are built for.")
		add        files
	)
	flag.Var(&add, "file", "PATH=SOURCE: put the file SOURCE at PATH in the image, mode 0755 (repeatable).")
	flag.Parse()
	if err := run(*out, *rootfs, *name, *entrypoint, *arch, add); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(out, rootfs, name, entrypoint, arch string, add []string) error {
	if (out == "") == (rootfs == "") {
		return errors.New("give exactly one of -out and -rootfs")
	}
	mtime, err := sourceDate()
	if err != nil {
		return err
	}
	entries, err := rootFS(add)
	if err != nil {
		return err
	}
	if rootfs != "" {
		return writeDir(rootfs, entries)
	}
	if name == "" {
		return errors.New("-name is required with -out")
	}
	if !hasFile(entries, entrypoint) {
		return fmt.Errorf("-entrypoint %q is not a file given with -file", entrypoint)
	}
	layerTar, err := tarEntries(entries, mtime)
	if err != nil {
		return err
	}
	return writeArchive(out, name, entrypoint, arch, layerTar, mtime)
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

// rootFS is the image's whole root filesystem, sorted by path.
func rootFS(add []string) ([]entry, error) {
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
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("-file %q: %w", a, err)
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

// writeArchive writes the image as an OCI layout, then tars the layout.
func writeArchive(out, name, entrypoint, arch string, layerTar []byte, mtime time.Time) error {
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if img, err = mutate.AppendLayers(img, layer); err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Created = v1.Time{Time: mtime}
	cf.Config = v1.Config{
		Entrypoint: []string{entrypoint},
		User:       fmt.Sprintf("%d:%d", uid, uid),
		WorkingDir: "/",
		Env:        []string{"PATH=/", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "image-layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return err
	}
	// containerd names an imported image from io.containerd.image.name;
	// other tools read the OCI ref.name.
	err = p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          name,
		"org.opencontainers.image.ref.name": name,
	}), layout.WithPlatform(v1.Platform{OS: "linux", Architecture: arch}))
	if err != nil {
		return err
	}
	return tarDir(out, tmp, mtime)
}

// tarDir writes dir's tree to the tar file out, in sorted order with fixed
// owners, modes and times, atomically.
func tarDir(out, dir string, mtime time.Time) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		names = append(names, p)
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	f, err := os.CreateTemp(filepath.Dir(out), ".image-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	tw := tar.NewWriter(f)
	for _, p := range names {
		rel, _ := filepath.Rel(dir, p)
		info, err := os.Stat(p)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: mtime, Mode: 0o644, Format: tar.FormatPAX}
		if info.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(f.Name(), out)
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
