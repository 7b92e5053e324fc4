package handle_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/queen-locks/queen-locks/handle"
)

// The token file's cost per call: read at every call (as the transport did
// before TokenReread) against the transport's, for a token file that is
// there and for a missing default one (the route with --auth=none, or a pod
// that mounts no token).
func BenchmarkTokenFile(b *testing.B) {
	dir := b.TempDir()
	present := filepath.Join(dir, "token")
	if err := os.WriteFile(present, []byte(strings.Repeat("x", 900)+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	b.Setenv(handle.TokenFileEnv, "")
	for _, c := range []struct {
		name string
		o    handle.HTTPOptions
		file string
	}{
		{"present", handle.HTTPOptions{TokenFile: present}, present},
		{"missing default", handle.HTTPOptions{}, filepath.Join(dir, "missing")},
	} {
		b.Run(c.name+"/read at every call", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				data, err := os.ReadFile(c.file)
				if err != nil && !errors.Is(err, fs.ErrNotExist) {
					b.Fatal(err)
				}
				_ = strings.TrimSpace(string(data))
			}
		})
		b.Run(c.name+"/transport", func(b *testing.B) {
			tr := handle.HTTPWith("http://127.0.0.1:1/", c.o, c.file, time.Now)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := handle.TokenOf(tr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
