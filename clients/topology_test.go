package clients_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/permit"
)

// The Python and JavaScript handles where the chart runs them: the route
// behind one address spreading calls over two replicas, the pod's own
// projected token, the lock in another namespace than the pod. The lock
// names the pod in its namespace, and a renew whose answer is lost is
// retried on the other replica and carried through: the handle goes on
// renewing, where before it would have taken the retry's "lost" for a loss
// and stopped.
func TestHandlesInTheChartsTopology(t *testing.T) {
	tp := env.Production(t, controlplane.TopologyOptions{Prefix: "clients"})
	for _, h := range []struct{ name, bin, script string }{
		{"python", "python3", "clients/python/tests/holder.py"},
		{"javascript", "node", "clients/js/testing/holder.js"},
	} {
		t.Run(h.name, func(t *testing.T) {
			lock := "topo-" + h.name
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, h.bin, h.script, "hold", lock)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "QUEEN_LOCKS_URL="+tp.URL, "QUEEN_LOCKS_TOKEN_FILE="+tp.TokenFile,
				"QUEEN_LOCKS_TEST_NAMESPACE="+tp.LockNS, "PYTHONDONTWRITEBYTECODE=1")
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = stdin.Close(); _ = cmd.Wait() }()
			var got struct {
				Acquired bool   `json:"acquired"`
				Token    uint64 `json:"token"`
			}
			line, err := bufio.NewReader(out).ReadBytes('\n')
			if err != nil || json.Unmarshal(line, &got) != nil || !got.Acquired {
				t.Fatalf("the holder answered %q (%v)", line, err)
			}
			p := current(t, tp.LockNS, lock)
			if hp := p.Spec.HolderPod; hp == nil || hp.Namespace != tp.PodNS || hp.Name != tp.Pod.Name {
				t.Fatalf("holderPod %+v, want the caller's pod %s/%s", hp, tp.PodNS, tp.Pod.Name)
			}
			// Lose the answer of the next renew (the holders renew every
			// 10 s); the retry lands on the other replica.
			tp.Proxy.DropAnswers(`"name":"`+lock+`"`, 1)
			// Three more renews: the dropped one, its carried-through
			// retry, and the next regular one, which only a handle that
			// still holds the lock sends.
			seen := map[string]bool{p.ResourceVersion: true}
			err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 40*time.Second, true, func(context.Context) (bool, error) {
				q := current(t, tp.LockNS, lock)
				seen[q.ResourceVersion] = true
				return len(seen) >= 4, nil
			})
			if err != nil {
				t.Fatalf("%d renews seen after the dropped answer, want 3: the handle stopped renewing", len(seen)-1)
			}
			if q := current(t, tp.LockNS, lock); strconv.FormatUint(got.Token, 10) == q.ResourceVersion {
				t.Fatal("the token never moved")
			}
		})
	}
}

// current reads the permit of lock's slot 0, failing when it is gone.
func current(t *testing.T, ns, lock string) *locksv1alpha1.QueenLock {
	t.Helper()
	p := &locksv1alpha1.QueenLock{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: permit.Name(lock, 0)}, p); err != nil {
		t.Fatalf("the permit of %s: %v", lock, err)
	}
	return p
}
