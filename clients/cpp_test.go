package clients_test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The C++ handle (clients/cpp) is built once per run, with CMake, into a
// directory under the run's temporary directory: both tests below use it,
// and nothing lands in the source tree.
var cppBuilt struct {
	once sync.Once
	dir  string
	err  error
}

func cppBuild(t *testing.T) string {
	t.Helper()
	cppBuilt.once.Do(func() {
		dir := filepath.Join(tmp, "cpp-build")
		for _, argv := range [][]string{
			{"cmake", "-S", "clients/cpp", "-B", dir, "-DCMAKE_BUILD_TYPE=Debug"},
			// Two jobs: the machine's cores are shared.
			{"cmake", "--build", dir, "--parallel", "2"},
		} {
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Dir = root
			start := time.Now()
			out, err := cmd.CombinedOutput()
			t.Logf("$ %s (%s)", strings.Join(argv, " "), time.Since(start).Round(time.Second))
			if err != nil {
				cppBuilt.err = fmt.Errorf("%s: %w (hack/handles/cpp.sh installs what it needs)\n%s", strings.Join(argv, " "), err, out)
				return
			}
		}
		cppBuilt.dir = dir
	})
	if cppBuilt.err != nil {
		t.Fatal(cppBuilt.err)
	}
	return cppBuilt.dir
}

func TestCppHandle(t *testing.T) {
	dir := cppBuild(t)
	// One test at a time: the checkpoint test counts the API server's writes.
	argv := append([]string{"ctest", "--test-dir", dir, "--output-on-failure", "--no-tests=error"}, only("-R")...)
	out := runTests(t, "cpp", argv...)
	// With the route given, nothing may be skipped or disabled: either would
	// hide a test that never ran.
	if only("") == nil && regexp.MustCompile(`\((Skipped|Disabled|Not Run)\)|tests did not run`).MatchString(out) {
		t.Fatal("ctest did not run every test with the route given (see above)")
	}
	m := regexp.MustCompile(`(?m)^100% tests passed, 0 tests failed out of (\d+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("ctest printed no summary of passed tests")
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 {
		t.Fatal("ctest ran no tests")
	}
}
