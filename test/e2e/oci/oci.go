// Package oci reads the OCI archives make image writes: an image index of
// one image per platform, each image's reference, configuration and root
// filesystem unpacked into a directory, and the artifacts (SBOMs) that
// refer to the images. Only what the e2e tests need, with the standard
// library alone, so the project's module takes no image library in.
package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// Media types of the manifests an archive holds.
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
)

// Archive is what an archive holds: the index.json's one entry, an image
// index (or a lone image), with its images and artifacts.
type Archive struct {
	// Name is the reference the archive records (io.containerd.image.name).
	Name string
	// Index is the image index's own digest ("" for a lone image).
	Index string
	// Images are the index's images, in its order.
	Images []*Image
	// Artifacts are the index's manifests with an artifactType, such as
	// SBOMs, in its order.
	Artifacts []*Artifact
}

// Platform is an image's platform as the image index gives it.
type Platform struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Variant      string `json:"variant,omitempty"`
}

func (p Platform) String() string {
	if p.Variant != "" {
		return p.OS + "/" + p.Architecture + "/" + p.Variant
	}
	return p.OS + "/" + p.Architecture
}

// Image is one image of an archive.
type Image struct {
	// Name is the reference the archive records (io.containerd.image.name).
	Name string
	// Digest is the digest of its manifest.
	Digest string
	// Platform is what the index says (for a lone image, what its
	// configuration says).
	Platform Platform
	Config   Config
	layers   [][]byte // compressed, in order
}

// Artifact is a manifest that is not an image: an SBOM, say.
type Artifact struct {
	Digest       string
	ArtifactType string
	// Subject is the digest of the manifest the artifact is about.
	Subject string
	// Files are its layers by their titles (org.opencontainers.image.title).
	Files map[string][]byte
}

// Config is the part of the image configuration a runtime uses to start it.
type Config struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Variant      string `json:"variant"`
	Config       struct {
		Entrypoint []string `json:"Entrypoint"`
		Cmd        []string `json:"Cmd"`
		User       string   `json:"User"`
		Env        []string `json:"Env"`
		WorkingDir string   `json:"WorkingDir"`
	} `json:"config"`
}

// UIDGID is the configuration's User as numbers ("65532:65532").
func (c Config) UIDGID() (uid, gid uint32, err error) {
	u, g, ok := strings.Cut(c.Config.User, ":")
	if !ok {
		return 0, 0, fmt.Errorf("image user %q is not UID:GID", c.Config.User)
	}
	uu, err := strconv.ParseUint(u, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("image user %q: %w", c.Config.User, err)
	}
	gg, err := strconv.ParseUint(g, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("image user %q: %w", c.Config.User, err)
	}
	return uint32(uu), uint32(gg), nil
}

type descriptor struct {
	MediaType    string            `json:"mediaType"`
	Digest       string            `json:"digest"`
	Size         int64             `json:"size"`
	ArtifactType string            `json:"artifactType"`
	Annotations  map[string]string `json:"annotations"`
	Platform     *Platform         `json:"platform"`
}

type manifest struct {
	MediaType    string       `json:"mediaType"`
	ArtifactType string       `json:"artifactType"`
	Config       descriptor   `json:"config"`
	Layers       []descriptor `json:"layers"`
	Subject      *descriptor  `json:"subject"`
}

// Read reads the image of the archive at file for this machine's platform
// (linux and its architecture), the one a node importing it runs.
func Read(file string) (*Image, error) {
	a, err := ReadArchive(file)
	if err != nil {
		return nil, err
	}
	return a.Image("linux", runtime.GOARCH)
}

// Image is the archive's image for the platform.
func (a *Archive) Image(os, arch string) (*Image, error) {
	var found []*Image
	for _, img := range a.Images {
		if img.Platform.OS == os && img.Platform.Architecture == arch {
			found = append(found, img)
		}
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("%s: %d images for %s/%s, want 1", a.Name, len(found), os, arch)
	}
	return found[0], nil
}

// Referrers are the artifacts whose subject is the manifest digest.
func (a *Archive) Referrers(digest string) []*Artifact {
	var refs []*Artifact
	for _, art := range a.Artifacts {
		if art.Subject == digest {
			refs = append(refs, art)
		}
	}
	return refs
}

// ReadArchive reads the archive at file, whose index.json must name
// exactly one image index or image.
func ReadArchive(file string) (*Archive, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		files[path.Clean(h.Name)] = b
	}
	if _, ok := files["oci-layout"]; !ok {
		return nil, fmt.Errorf("%s is not an OCI archive: no oci-layout file", file)
	}
	blob := func(d descriptor) ([]byte, error) {
		algo, hexsum, ok := strings.Cut(d.Digest, ":")
		if !ok || algo != "sha256" {
			return nil, fmt.Errorf("%s: digest %q is not sha256", file, d.Digest)
		}
		b, ok := files["blobs/sha256/"+hexsum]
		if !ok {
			return nil, fmt.Errorf("%s: blob %s is missing", file, d.Digest)
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != hexsum || int64(len(b)) != d.Size {
			return nil, fmt.Errorf("%s: blob %s does not match its digest and size", file, d.Digest)
		}
		return b, nil
	}
	var top struct{ Manifests []descriptor }
	if err := json.Unmarshal(files["index.json"], &top); err != nil {
		return nil, fmt.Errorf("%s: index.json: %w", file, err)
	}
	if len(top.Manifests) != 1 {
		return nil, fmt.Errorf("%s: index.json names %d manifests, want 1", file, len(top.Manifests))
	}
	named := top.Manifests[0]
	a := &Archive{Name: named.Annotations["io.containerd.image.name"]}
	children := []descriptor{named}
	if named.MediaType == MediaTypeIndex {
		b, err := blob(named)
		if err != nil {
			return nil, err
		}
		var index struct{ Manifests []descriptor }
		if err := json.Unmarshal(b, &index); err != nil {
			return nil, fmt.Errorf("%s: image index: %w", file, err)
		}
		a.Index, children = named.Digest, index.Manifests
	}
	for _, d := range children {
		if d.MediaType != MediaTypeManifest {
			return nil, fmt.Errorf("%s: manifest %s is %s, want %s", file, d.Digest, d.MediaType, MediaTypeManifest)
		}
		b, err := blob(d)
		if err != nil {
			return nil, err
		}
		var m manifest
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("%s: manifest %s: %w", file, d.Digest, err)
		}
		if m.ArtifactType != "" {
			art := &Artifact{Digest: d.Digest, ArtifactType: m.ArtifactType, Files: map[string][]byte{}}
			if m.Subject != nil {
				art.Subject = m.Subject.Digest
			}
			for _, l := range m.Layers {
				b, err := blob(l)
				if err != nil {
					return nil, err
				}
				art.Files[l.Annotations["org.opencontainers.image.title"]] = b
			}
			a.Artifacts = append(a.Artifacts, art)
			continue
		}
		img := &Image{Name: a.Name, Digest: d.Digest}
		if b, err = blob(m.Config); err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, &img.Config); err != nil {
			return nil, fmt.Errorf("%s: config: %w", file, err)
		}
		img.Platform = Platform{OS: img.Config.OS, Architecture: img.Config.Architecture, Variant: img.Config.Variant}
		if d.Platform != nil {
			img.Platform = *d.Platform
		}
		for _, l := range m.Layers {
			if !strings.HasSuffix(l.MediaType, "+gzip") {
				return nil, fmt.Errorf("%s: layer %s is %s, want a gzip layer", file, l.Digest, l.MediaType)
			}
			b, err := blob(l)
			if err != nil {
				return nil, err
			}
			img.layers = append(img.layers, b)
		}
		a.Images = append(a.Images, img)
	}
	return a, nil
}

// Unpack writes the image's root filesystem into dir, with the owners and
// modes the layers record. It runs as root to set owners.
func (img *Image) Unpack(dir string) error {
	for i, l := range img.layers {
		if err := unpackLayer(dir, l); err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
	}
	return nil
}

func unpackLayer(dir string, layer []byte) error {
	zr, err := gzip.NewReader(bytes.NewReader(layer))
	if err != nil {
		return err
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + h.Name)
		if strings.HasPrefix(path.Base(name), ".wh.") {
			return fmt.Errorf("%s: whiteouts are not supported", h.Name)
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		mode := os.FileMode(h.Mode).Perm()
		if h.Mode&0o1000 != 0 {
			mode |= os.ModeSticky
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: entry type %q is not supported", h.Name, h.Typeflag)
		}
		if err := os.Chmod(p, mode); err != nil {
			return err
		}
		if err := os.Lchown(p, h.Uid, h.Gid); err != nil {
			return err
		}
	}
}
