package cli_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The token file, read as fast as we can while the lock (TTL 2s) is renewed
// every third of its lifetime: every read is one whole token, never older
// than one read before. (2 s, not 1 s: on a loaded machine a 1 s lease can
// end on a slow call, and the run with it.)
func TestTokenFileNeverGoesBack(t *testing.T) {
	where(t, func(t *testing.T, ns string, conn []string) {
		dir := t.TempDir()
		script := `echo "$QUEEN_LOCK_TOKEN_FILE" > ` + dir + `/path.tmp; mv ` + dir + `/path.tmp ` + dir + `/path
while [ ! -f ` + dir + `/stop ]; do sleep 0.05; done`
		c := cmd("run", "tokens", conn, "--ttl", "2s", "--", "sh", "-c", script)
		var stderr syncBuffer
		c.Stderr = &stderr
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the command to start", func() bool { return exists(filepath.Join(dir, "path")) })
		b, _ := os.ReadFile(filepath.Join(dir, "path"))
		path := strings.TrimSpace(string(b))
		var last uint64
		distinct, reads := 0, 0
		eventually(t, "six renewed tokens", func() bool {
			for range 100 {
				raw, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("read %d: %v", reads, err)
				}
				reads++
				tok, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64)
				if err != nil || !strings.HasSuffix(string(raw), "\n") {
					t.Fatalf("read %d: %q is not one whole token", reads, raw)
				}
				if tok < last {
					t.Fatalf("read %d: token %d after %d", reads, tok, last)
				}
				if tok > last {
					distinct++
					last = tok
				}
			}
			return distinct >= 6
		})
		if err := os.WriteFile(filepath.Join(dir, "stop"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if code := exitCode(c.Wait()); code != 0 {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
		t.Logf("%d reads, %d tokens", reads, distinct)
	})
}
