package cli

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Tokens handed in from many goroutines in any order: a reader never sees
// the file go back, and after flush it holds the newest.
func TestTokenFileWriterKeepsTheNewest(t *testing.T) {
	dir := t.TempDir()
	tf := newTokenFile(dir, func(err error) { t.Errorf("write: %v", err) })
	defer tf.close()
	var stop atomic.Bool
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		var last uint64
		for !stop.Load() {
			raw, err := os.ReadFile(tf.path)
			if os.IsNotExist(err) {
				continue
			}
			tok, perr := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64)
			if err != nil || perr != nil || tok < last {
				t.Errorf("read %q (%v) after %d", raw, err, last)
				return
			}
			last = tok
		}
	}()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				tf.set(uint64(i*8 + g + 1))
				if i%50 == 0 {
					if err := tf.flush(); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	if err := tf.flush(); err != nil {
		t.Fatal(err)
	}
	stop.Store(true)
	<-readerDone
	raw, _ := os.ReadFile(tf.path)
	if got := strings.TrimSpace(string(raw)); got != "1600" {
		t.Fatalf("the file holds %q, want the newest 1600", got)
	}
	// Each write used a temporary file of its own, and none is left.
	left, _ := filepath.Glob(filepath.Join(dir, ".token-*"))
	if len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}
