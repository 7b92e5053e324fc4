package controlplane

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestMain runs a package's tests against one control plane: it starts it
// with o, hands it to set, runs the tests and stops it. With -short it runs
// nothing, so unit tests alone stay fast.
func TestMain(m *testing.M, o Options, set func(*Env)) int {
	flag.Parse()
	if testing.Short() {
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
func fuzzing() bool {
	for _, name := range []string{"test.fuzz", "test.fuzzworker"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" && f.Value.String() != "false" {
			return true
		}
	}
	return false
}

// Namespace makes a fresh namespace, named from prefix, for one test.
func (e *Env) Namespace(t testing.TB, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := e.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}
