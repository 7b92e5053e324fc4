package cli

import (
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

// tokenFile keeps QUEEN_LOCK_TOKEN_FILE holding the newest token. Tokens
// come from two goroutines (the run's first token and each renew's), so they
// are handed to one writer goroutine, which writes only a token newer than
// the file's: an older token can never replace a newer one. Each write goes
// to a temporary file of its own in the same directory, synced and renamed
// over the old, so a reader sees one whole token or the one before.
type tokenFile struct {
	path string
	warn func(error) // told when a write fails: CMD then reads an older token, which fences safely

	mu        sync.Mutex
	changed   *sync.Cond
	want      uint64 // the newest token handed in
	attempted uint64 // the newest token the writer has tried to write
	written   uint64 // the newest token the file holds
	err       error  // the last write's error
	closed    bool
	done      chan struct{}
}

func newTokenFile(dir string, warn func(error)) *tokenFile {
	t := &tokenFile{path: filepath.Join(dir, "token"), warn: warn, done: make(chan struct{})}
	t.changed = sync.NewCond(&t.mu)
	go t.writer()
	return t
}

// set hands in a token; older ones than already handed in are ignored.
func (t *tokenFile) set(token uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if token > t.want {
		t.want = token
		t.changed.Broadcast()
	}
}

// flush waits until the file holds the newest token handed in, or a newer
// one, and answers the error of writing it.
func (t *tokenFile) flush() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	target := t.want
	for t.written < target && (t.attempted < target || t.err == nil) && !t.closed {
		t.changed.Wait()
	}
	if t.written >= target {
		return nil
	}
	return t.err
}

// close stops the writer and waits for it.
func (t *tokenFile) close() {
	t.mu.Lock()
	t.closed = true
	t.changed.Broadcast()
	t.mu.Unlock()
	<-t.done
}

func (t *tokenFile) writer() {
	defer close(t.done)
	t.mu.Lock()
	defer t.mu.Unlock()
	for {
		for t.want <= t.attempted && !t.closed {
			t.changed.Wait()
		}
		if t.closed {
			return
		}
		token := t.want
		t.attempted = token
		t.mu.Unlock()
		err := writeAtomic(t.path, token)
		if err != nil && t.warn != nil {
			t.warn(err)
		}
		t.mu.Lock()
		t.err = err
		if err == nil {
			t.written = token
		}
		t.changed.Broadcast()
	}
}

// writeAtomic replaces path with a file holding token.
func writeAtomic(path string, token uint64) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".token-*")
	if err != nil {
		return err
	}
	_, err = f.WriteString(strconv.FormatUint(token, 10) + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}
