package permit

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestClientLibrariesDeclareTheseLimits reads the limits each handle in
// another language declares for itself (they check a call before sending
// it, so a bad one fails in the caller's language, not with a 400) and
// compares them with this package's: a limit changed here and not there
// would have a handle refuse what the route takes, or send what it
// refuses.
func TestClientLibrariesDeclareTheseLimits(t *testing.T) {
	want := map[string]int64{
		"name bytes":  MaxNameBytes,
		"owner bytes": MaxOwnerBytes,
		"ttl seconds": MaxTTLSeconds,
		"limit":       MaxLimit,
	}
	upper := map[string]string{"name bytes": "MAX_NAME_BYTES", "owner bytes": "MAX_OWNER_BYTES", "ttl seconds": "MAX_TTL_SECONDS", "limit": "MAX_LIMIT"}
	cpp := map[string]string{"name bytes": "kMaxNameBytes", "owner bytes": "kMaxOwnerBytes", "ttl seconds": "kMaxTtlSeconds", "limit": "kMaxLimit"}
	for _, lib := range []struct {
		file  string
		names map[string]string
	}{
		{"python/queen_locks/_handle.py", upper},
		{"js/lib/input.js", upper},
		{"js/index.d.ts", upper}, // the TypeScript types give the values as literal types
		{"rust/src/input.rs", upper},
		{"php/src/Limits.php", upper},
		{"cpp/src/validate.hpp", cpp},
	} {
		src, err := os.ReadFile(filepath.Join("..", "clients", filepath.FromSlash(lib.file)))
		if err != nil {
			t.Fatal(err)
		}
		for what, name := range lib.names {
			// NAME = 256, NAME: 256, NAME: usize = 31_536_000, ... = 1024;
			re := regexp.MustCompile(`\b` + name + `\b\s*(?::\s*[\w:]+\s*)?[=:]\s*([0-9_]+)\b`)
			m := re.FindAllSubmatch(src, -1)
			if len(m) != 1 {
				t.Errorf("clients/%s: %d declarations of %s (the %s limit), want 1", lib.file, len(m), name, what)
				continue
			}
			got, err := strconv.ParseInt(strings.ReplaceAll(string(m[0][1]), "_", ""), 10, 64)
			if err != nil || got != want[what] {
				t.Errorf("clients/%s: %s is %s, want %d (permit's %s limit)", lib.file, name, m[0][1], want[what], what)
			}
		}
	}
}
