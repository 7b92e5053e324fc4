// Package oci reads the OCI archives make image writes: the image's
// reference, its configuration, and its root filesystem unpacked into a
// directory. Only what the e2e tests need, with the standard library alone,
// so the project's module takes no image library in.
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
	"strconv"
	"strings"
)

// Image is one image of an archive.
type Image struct {
	// Name is the reference the archive records (io.containerd.image.name).
	Name   string
	Config Config
	layers [][]byte // compressed, in order
}

// Config is the part of the image configuration a runtime uses to start it.
type Config struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
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
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Annotations map[string]string `json:"annotations"`
}

// Read reads the archive at file, which must hold exactly one image.
func Read(file string) (*Image, error) {
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
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != hexsum {
			return nil, fmt.Errorf("%s: blob %s does not match its digest", file, d.Digest)
		}
		return b, nil
	}
	var index struct{ Manifests []descriptor }
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		return nil, fmt.Errorf("%s: index.json: %w", file, err)
	}
	if len(index.Manifests) != 1 {
		return nil, fmt.Errorf("%s: %d images, want 1", file, len(index.Manifests))
	}
	md := index.Manifests[0]
	img := &Image{Name: md.Annotations["io.containerd.image.name"]}
	b, err := blob(md)
	if err != nil {
		return nil, err
	}
	var manifest struct {
		Config descriptor
		Layers []descriptor
	}
	if err := json.Unmarshal(b, &manifest); err != nil {
		return nil, fmt.Errorf("%s: manifest: %w", file, err)
	}
	if b, err = blob(manifest.Config); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &img.Config); err != nil {
		return nil, fmt.Errorf("%s: config: %w", file, err)
	}
	for _, l := range manifest.Layers {
		if !strings.HasSuffix(l.MediaType, "+gzip") {
			return nil, fmt.Errorf("%s: layer %s is %s, want a gzip layer", file, l.Digest, l.MediaType)
		}
		b, err := blob(l)
		if err != nil {
			return nil, err
		}
		img.layers = append(img.layers, b)
	}
	return img, nil
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
