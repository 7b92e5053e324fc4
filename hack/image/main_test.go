package main

import (
	"archive/tar"
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

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

// The same inputs give the same archive, byte for byte, whenever built.
func TestReproducible(t *testing.T) {
	add := writeBinaries(t)
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	if err := run(a, "", "example.test/queen-locks:1", "/manager", "amd64", add); err != nil {
		t.Fatal(err)
	}
	// Touch the inputs: their times must not matter.
	for _, f := range add {
		src := strings.SplitN(f, "=", 2)[1]
		if err := os.Chtimes(src, time.Now(), time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if err := run(b, "", "example.test/queen-locks:1", "/manager", "amd64", add); err != nil {
		t.Fatal(err)
	}
	ab, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	if len(ab) == 0 || !bytes.Equal(ab, bb) {
		t.Fatalf("two builds differ (%d and %d bytes)", len(ab), len(bb))
	}
}

// The archive is an OCI layout holding one image with the binaries, the
// user and the entrypoint; -rootfs writes the very same files.
func TestArchiveAndRootFS(t *testing.T) {
	add := writeBinaries(t)
	dir := t.TempDir()
	archive := filepath.Join(dir, "image.tar")
	if err := run(archive, "", "example.test/queen-locks:1", "/manager", "amd64", add); err != nil {
		t.Fatal(err)
	}
	layoutDir := filepath.Join(dir, "layout")
	untar(t, archive, layoutDir)
	idx, err := layout.ImageIndexFromPath(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Annotations["io.containerd.image.name"] != "example.test/queen-locks:1" {
		t.Fatalf("index: %+v", m.Manifests)
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
		if err == io.EOF {
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
		if !contains(inImage, want) {
			t.Errorf("the image lacks %s; it has %v", want, inImage)
		}
	}

	rootfs := filepath.Join(dir, "rootfs")
	if err := run("", rootfs, "", "", "amd64", add); err != nil {
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
		if err := run(filepath.Join(t.TempDir(), "x.tar"), "", "n:1", "/manager", "amd64", add); err == nil {
			t.Errorf("-file %q: no error", add)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
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
		if err == io.EOF {
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
