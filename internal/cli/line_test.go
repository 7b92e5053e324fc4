package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/locks/waiters"
)

// list --waiting prints each lock's line in its order, with each waiter's
// place, owner and since; a plain list still shows the holders alone.
func TestListWaitingShowsTheLineInOrder(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := namespace(t)
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: manager.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	l := locks.New(wc, nil, locks.WithGrace(env.Grace))
	if a, err := l.Acquire(ctx, ns, "busy", "holder", 600, 1); err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	done := make(chan struct{}, 3)
	for i := range 3 {
		go func() {
			_, _ = l.Acquire(ctx, ns, "busy", fmt.Sprintf("waiter-%d", i), 600, 1, locks.WaitUpTo(time.Minute, waiters.Watcher{C: wc, Grace: env.Grace}))
			done <- struct{}{}
		}()
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			n, err := l.Waiting(ctx, ns, "busy")
			return n == i+1, err
		}); err != nil {
			t.Fatalf("waiter %d never joined the line: %v", i, err)
		}
	}

	c := exec.Command(queenlock, "list", "--waiting", "--kubeconfig", kubeconfig, "-n", ns)
	c.Env = append(os.Environ(), "QUEEN_LOCKS_URL=")
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		t.Fatalf("queenlock list --waiting: %v: %s", err, stderr.String())
	}
	var out struct {
		Namespace string `json:"namespace"`
		Lines     []struct {
			Name    string `json:"name"`
			Waiting []struct {
				Place int    `json:"place"`
				Owner string `json:"owner"`
				Since string `json:"since"`
			} `json:"waiting"`
		} `json:"lines"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil || out.Namespace != ns || len(out.Lines) != 1 || out.Lines[0].Name != "busy" {
		t.Fatalf("queenlock list --waiting: %v: %s", err, stdout.String())
	}
	for i, w := range out.Lines[0].Waiting {
		if w.Place != i+1 || w.Owner != fmt.Sprintf("waiter-%d", i) || w.Since == "" {
			t.Fatalf("place %d of the line is %+v: %s", i+1, w, stdout.String())
		}
	}
	if len(out.Lines[0].Waiting) != 3 {
		t.Fatalf("the line has %d waiters, want 3: %s", len(out.Lines[0].Waiting), stdout.String())
	}
	if _, raw := listLocks(t, ns); strings.Contains(raw, "waiter-") {
		t.Fatalf("a plain list shows waiters: %s", raw)
	}
	cancel()
	for range 3 {
		<-done
	}
}

// A waiting run whose process is killed leaves the line within seconds:
// its waiter stops being renewed and the manager removes it.
func TestAKilledWaiterLeavesTheLine(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	l := locks.New(env.Client, nil)
	if a, err := l.Acquire(ctx, ns, "held-long", "holder", 600, 1); err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	c := cmd("run", "held-long", []string{"--kubeconfig", kubeconfig, "-n", ns}, "--ttl", "90s", "--wait", "60s", "--", "true")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = c.Wait(); close(exited) }()
	line := func(n int) time.Duration {
		start := time.Now()
		if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			got, err := l.Waiting(ctx, ns, "held-long")
			return got == n, err
		}); err != nil {
			t.Fatalf("the line never held %d: %v", n, err)
		}
		return time.Since(start)
	}
	line(1)
	if err := c.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-exited
	t.Logf("the killed waiter left the line %v after", line(0).Round(time.Millisecond))
}
