package cli_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/queen-locks/queen-locks/locks"
)

type listedHolder struct {
	Slot    int    `json:"slot"`
	Owner   string `json:"owner"`
	Token   uint64 `json:"token"`
	Pod     string `json:"pod"`
	Expired bool   `json:"expired"`
}

// listLocks runs queenlock list over the Kubernetes API and answers the
// holders of each lock, by lock name, and the raw output.
func listLocks(t *testing.T, ns string, args ...string) (map[string][]listedHolder, string) {
	t.Helper()
	c := exec.Command(queenlock, append([]string{"list", "--kubeconfig", kubeconfig, "-n", ns}, args...)...)
	c.Env = append(os.Environ(), "QUEEN_LOCKS_URL=")
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		t.Fatalf("queenlock list %v: %v: %s", args, err, stderr.String())
	}
	if strings.Contains(strings.Join(args, " "), "table") {
		return nil, stdout.String()
	}
	var out struct {
		Namespace string `json:"namespace"`
		Locks     []struct {
			Name    string         `json:"name"`
			Holders []listedHolder `json:"holders"`
		} `json:"locks"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil || out.Namespace != ns {
		t.Fatalf("queenlock list: %v, namespace %q: %s", err, out.Namespace, stdout.String())
	}
	byLock := map[string][]listedHolder{}
	for _, l := range out.Locks {
		byLock[l.Name] = l.Holders
	}
	return byLock, stdout.String()
}

// list shows each permit's holder pod, which lives in its own namespace,
// and marks a permit past its expireTime and the grace that the controller
// has not deleted.
func TestListShowsHolderPodsAndExpiredPermits(t *testing.T) {
	ctx := context.Background()
	ns, podNS := namespace(t), namespace(t)
	env.BlockPermitDeletes(t, ns)
	p := env.Pod(t, podNS, "worker", "default")
	l := locks.New(env.Client, nil)
	for _, c := range []struct {
		lock string
		ttl  int64
		opts []locks.AcquireOption
	}{
		{"by-pod", 600, []locks.AcquireOption{locks.HolderPod(p.Namespace, p.Name, string(p.UID))}},
		{"by-nobody", 600, nil},
		{"stuck", 1, nil},
	} {
		if a, err := l.Acquire(ctx, ns, c.lock, "owner-"+c.lock, c.ttl, 1, c.opts...); err != nil || !a.Acquired {
			t.Fatal(c.lock, a, err)
		}
	}

	// Past its expireTime and the (default, 1 s) grace, the stuck permit
	// is still there: the policy refuses the controller's delete.
	var got map[string][]listedHolder
	var raw string
	eventually(t, "the stuck permit to be listed as expired", func() bool {
		got, raw = listLocks(t, ns)
		return len(got["stuck"]) == 1 && got["stuck"][0].Expired
	})
	if h := got["by-pod"]; len(h) != 1 || h[0].Pod != podNS+"/worker" || h[0].Expired || h[0].Owner != "owner-by-pod" {
		t.Errorf("the pod's permit is listed as %+v, want its pod %s/worker, not expired: %s", h, podNS, raw)
	}
	if h := got["by-nobody"]; len(h) != 1 || h[0].Pod != "" || h[0].Expired {
		t.Errorf("the permit of no pod is listed as %+v: %s", h, raw)
	}
	if strings.Count(raw, `"expired"`) != 1 || strings.Count(raw, `"pod"`) != 1 {
		t.Errorf("expired and pod appear where they are not true or set: %s", raw)
	}

	// Within a longer grace it is not overdue yet: left out, as the
	// controller would not have deleted it yet either.
	if got, raw := listLocks(t, ns, "--expiry-grace", "1h"); got["stuck"] != nil || len(got["by-pod"]) != 1 {
		t.Errorf("with a grace of an hour: %s", raw)
	}

	_, table := listLocks(t, ns, "-o", "table")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "LOCK") || !strings.Contains(lines[0], "POD") || !strings.Contains(lines[0], "EXPIRED") {
		t.Fatalf("table:\n%s", table)
	}
	for _, line := range lines[1:] {
		f := strings.Fields(line)
		switch f[0] {
		case "stuck":
			if f[len(f)-1] != "EXPIRED" {
				t.Errorf("the stuck permit is not marked: %q", line)
			}
		case "by-pod":
			if f[4] != podNS+"/worker" || strings.HasSuffix(line, "EXPIRED") {
				t.Errorf("the pod's permit: %q", line)
			}
		case "by-nobody", "probe":
			if f[4] != "-" || strings.HasSuffix(line, "EXPIRED") {
				t.Errorf("a permit of no pod: %q", line)
			}
		default:
			t.Errorf("unexpected line %q", line)
		}
	}
}

// A kubeconfig whose credentials the API server refuses gets the server's
// answer, for list as for a lock command, not a failure of discovery
// (which queenlock no longer does).
func TestRefusedCredentialsSayUnauthorized(t *testing.T) {
	ns := namespace(t)
	ca := base64.StdEncoding.EncodeToString(env.Config.CAData)
	cfg := "apiVersion: v1\nkind: Config\n" +
		"clusters: [{name: c, cluster: {server: " + env.Config.Host + ", certificate-authority-data: " + ca + "}}]\n" +
		"users: [{name: nobody, user: {token: not-a-token}}]\n" +
		"contexts: [{name: c, context: {cluster: c, user: nobody, namespace: " + ns + "}}]\n" +
		"current-context: c\n"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"list"},
		{"acquire", "job", "--ttl", "30s"},
		{"get", "job"},
	} {
		c := exec.Command(queenlock, append(args, "--kubeconfig", path)...)
		c.Env = append(os.Environ(), "QUEEN_LOCKS_URL=")
		var stderr bytes.Buffer
		c.Stderr = &stderr
		err := c.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Fatalf("queenlock %v: %v (want exit status 1): %s", args, err, stderr.String())
		}
		msg := stderr.String()
		t.Logf("queenlock %v: %s", args, strings.TrimSpace(msg))
		if !strings.Contains(msg, "Unauthorized") || !strings.Contains(msg, "did not accept the credentials") || strings.Contains(msg, "server groups") {
			t.Errorf("queenlock %v said %q; want the API server's Unauthorized, explained", args, msg)
		}
	}
}
