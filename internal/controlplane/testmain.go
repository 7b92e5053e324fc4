package controlplane

import (
	"context"
	"flag"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// T is what this package's helpers need of a test: a *testing.T, a
// *testing.B or any testing.TB is one. They take T, and TestMain takes M,
// rather than the testing package's types so that this package does not
// import testing: make dev's binary (cmd/dev) links it, and a program
// that links testing carries the test framework and its flags.
type T interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	TempDir() string
}

// M is what TestMain needs of a test binary's *testing.M.
type M interface{ Run() int }

// TestMain runs a package's tests against one control plane: it starts it
// with o, hands it to set, runs the tests and stops it. With -short it runs
// nothing, so unit tests alone stay fast.
func TestMain(m M, o Options, set func(*Env)) int {
	flag.Parse()
	if testFlag("test.short") {
		fmt.Println("skipping the control-plane suite in -short mode")
		return 0
	}
	if fuzzing() {
		// Fuzzing runs one fuzz target, in many worker processes: none of
		// them needs a control plane of its own.
		return m.Run()
	}
	e, err := Start(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	set(e)
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the control plane:", err)
	}
	return code
}

// fuzzing tells whether this test binary runs as a fuzzer or one of its workers.
func fuzzing() bool { return testFlag("test.fuzz") || testFlag("test.fuzzworker") }

// testFlag tells whether the test binary's flag name is set (testing's
// own flags, as testing.Short reads -test.short): a boolean flag true, a
// string flag not empty.
func testFlag(name string) bool {
	f := flag.Lookup(name)
	return f != nil && f.Value.String() != "" && f.Value.String() != "false"
}

// Namespace makes a fresh namespace, named from prefix, for one test.
func (e *Env) Namespace(t T, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := e.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}
