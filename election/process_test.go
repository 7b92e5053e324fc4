package election_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/internal/controlplane"
)

// writtenBy is examples/fenced-controller's annotation naming the replica
// that wrote its target last.
const writtenBy = "example.queen.dev/written-by"

// syncBuffer is a process's output, read while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is one replica of examples/fenced-controller, a process of its own.
type proc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan error
}

func startProc(t *testing.T, bin, kubeconfig, ns, id string) *proc {
	t.Helper()
	p := &proc{out: &syncBuffer{}, done: make(chan error, 1)}
	p.cmd = exec.Command(bin, "--namespace", ns, "--identity", id, "--source", "settings", "--target", "settings-copy",
		"--lease-duration", leaseDuration.String(), "--renew-deadline", renewDeadline.String(), "--retry-period", retryPeriod.String())
	p.cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case err := <-p.done:
			p.done <- err
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Kill()
		if err := <-p.done; err != nil {
			t.Logf("%s, stopped at the end: %v", p.cmd.Args[4], err)
		}
	})
	return p
}

func (p *proc) signal(t *testing.T, s syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(s); err != nil {
		t.Fatal(err)
	}
}

// The stale leader as separate processes: two replicas of
// examples/fenced-controller. a leads and writes; a is frozen with SIGSTOP
// past its lease; b takes over (and is frozen in turn, so that only a acts
// on what comes next); the source changes; a is continued, finds its
// target out of step and writes. None of a's writes after the takeover is
// stored (read from the API server's watch), every write a tries after it
// is refused as lost, and a's process exits on the lost lease.
func TestTheStaleLeaderProcessCannotWrite(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	bin := filepath.Join(dir, "fenced-controller")
	build := exec.Command("go", "build", "-o", bin, "./examples/fenced-controller")
	build.Dir = controlplane.Root()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the example: %v\n%s", err, out)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.Env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t, "sigstop")
	h := record(t, ns)
	src := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "settings"}, Data: map[string]string{"colour": "blue"}}
	if err := env.Client.Create(ctx, src); err != nil {
		t.Fatal(err)
	}

	a := startProc(t, bin, kubeconfig, ns, "a")
	eventually(t, "a's copy", func() bool { return h.count("ConfigMap", "a") >= 1 })
	a.signal(t, syscall.SIGSTOP)

	b := startProc(t, bin, kubeconfig, ns, "b")
	eventually(t, "b to take over", func() bool { _, ok := h.takenOver("b"); return ok })
	takeover, _ := h.takenOver("b")
	src.Data = map[string]string{"colour": "green"}
	if err := env.Client.Update(ctx, src); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b's copy", func() bool { return h.count("ConfigMap", "b") >= 1 })

	// Freeze b, change the source once more, and let a go: a alone sees
	// its target out of step.
	b.signal(t, syscall.SIGSTOP)
	src.Data = map[string]string{"colour": "red"}
	if err := env.Client.Update(ctx, src); err != nil {
		t.Fatal(err)
	}
	a.signal(t, syscall.SIGCONT)
	select {
	case err := <-a.done:
		if err == nil {
			t.Fatalf("a exited 0 after losing its lease:\n%s", a.out.String())
		}
		a.done <- err
	case <-awaitTimeout():
		t.Fatalf("a still runs a minute after it was continued:\n%s", a.out.String())
	}
	b.signal(t, syscall.SIGCONT)

	out := a.out.String()
	if !strings.Contains(out, "leader election lost") {
		t.Fatalf("a did not stop on a lost lease:\n%s", out)
	}
	if late := h.writesAfter("a", takeover); len(late) > 0 {
		t.Fatalf("stored writes of a after b's takeover at %d: %v\n%s", takeover, late, out)
	}
	// Every write a tried once continued was refused: by the webhook
	// first, or by its own client at once (its lease over on its own
	// clock, or its renew having found the permit b's), then by its
	// client, unsent.
	tried, sent := 0, 0
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, "write refused or failed") {
			continue
		}
		tried++
		switch {
		case !strings.Contains(line, "the holding was lost") && !strings.Contains(line, "the lock is not held"):
			t.Fatalf("a's write after the takeover failed otherwise: %s", line)
		case strings.Contains(line, "not sent"):
		case tried == 1 && strings.Contains(line, "kv_precondition"):
			sent++
		default:
			t.Fatalf("a's write %d after the takeover was sent: %s", tried, line)
		}
	}
	t.Logf("takeover at %d; a tried %d writes after it (%d sent and refused by the webhook, the rest refused unsent), none stored",
		takeover, tried, sent)
	cm := &corev1.ConfigMap{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "settings-copy"}, cm); err != nil {
		t.Fatal(err)
	}
	if cm.Annotations[writtenBy] == "a" {
		t.Fatalf("the copy is a's: %v", cm.Annotations)
	}
}
