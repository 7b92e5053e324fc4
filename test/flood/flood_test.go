// Package flood holds the manager to a flood of its webhook port and its
// route beside live holders. It runs bin/manager as a process of
// its own, so that its peak resident memory is the manager's alone, and
// only with QUEEN_LOCKS_FLOOD=1 (make flood): it takes minutes.
package flood

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/test/internal/child"
	"github.com/queen-locks/queen-locks/test/internal/loopback"
)

// The flood's size and length.
const (
	bigBodies   = 100
	dribblers   = 100
	poolHolders = 4
	holders     = 50
	floodFor    = 90 * time.Second
	bigBody     = 7_000_000 - 1
)

func TestFlood(t *testing.T) {
	if os.Getenv("QUEEN_LOCKS_FLOOD") == "" {
		t.Skip("set QUEEN_LOCKS_FLOOD=1 (make flood) to run the flood: it takes minutes")
	}
	root := controlplane.Root()
	env, err := controlplane.Start(controlplane.Options{NoManager: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := env.Stop(); err != nil {
			t.Logf("stopping the control plane: %v", err)
		}
	}()
	ctx := context.Background()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.Env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}

	// The manager, its own process, without a client CA: the worst case,
	// where every pod reaches the webhook port.
	wo := env.Env.WebhookInstallOptions
	routeAddr, probeAddr := loopback.FreeAddrT(t), loopback.FreeAddrT(t)
	cmd := exec.Command(filepath.Join(root, "bin", "manager"),
		"--webhook-host", wo.LocalServingHost, "--webhook-port", strconv.Itoa(wo.LocalServingPort), "--webhook-cert-dir", wo.LocalServingCertDir,
		"--route-address", routeAddr, "--auth", route.AuthToken, "--leader-elect=false",
		"--metrics-bind-address", "0", "--health-probe-bind-address", probeAddr)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	logf, err := os.Create(filepath.Join(dir, "manager.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }()
	routeURL := "http://" + routeAddr + route.Path
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		resp, err := http.Get("http://" + probeAddr + "/readyz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}); err != nil {
		t.Fatalf("the manager never became ready: %v", err)
	}
	if err := env.ApplyFile("config/rbac/holder_role.yaml"); err != nil {
		t.Fatal(err)
	}

	// Identities: a holder namespace, four attacker namespaces.
	identity := func(prefix string) (ns, token string) {
		ns = env.Namespace(t, prefix)
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "runner"}}
		if err := env.Client.Create(ctx, sa); err != nil {
			t.Fatal(err)
		}
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "runner"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "queen-locks-holder"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "runner", Namespace: ns}}}
		if err := env.Client.Create(ctx, rb); err != nil {
			t.Fatal(err)
		}
		pod := env.Pod(t, ns, "runner", "runner")
		return ns, env.PodToken(t, pod, route.Audience)
	}
	// The holders are ten ServiceAccounts of five holders each (pods of
	// one ServiceAccount share its per-caller bound of 16 calls in
	// progress); the guarded and kubectl writes have one of their own.
	const holderIdentities = 10
	var holdTokens [holderIdentities]string
	for i := range holdTokens {
		_, holdTokens[i] = identity(fmt.Sprintf("flood-holders-%d", i))
	}
	holdNS, holdToken := identity("flood-writes")

	hc := &http.Client{Timeout: 30 * time.Second}
	callRoute := func(token, body string) (int, map[string]any, error) {
		req, _ := http.NewRequest(http.MethodPost, routeURL, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out, nil
	}
	result := func(out map[string]any) map[string]any {
		rs, _ := out["results"].([]any)
		if len(rs) == 0 {
			return nil
		}
		r, _ := rs[0].(map[string]any)
		return r
	}

	// 50 holders, each with its lock.
	tokens := make([]float64, holders)
	for i := range holders {
		code, out, err := callRoute(holdTokens[i%holderIdentities], fmt.Sprintf(`{"operations":[{"op":"acquire","name":"lock-%d","ttlSeconds":30,"owner":"h%d"}]}`, i, i))
		if err != nil || code != 200 || result(out)["acquired"] != true {
			t.Fatalf("holder %d could not acquire: %d %v %v", i, code, out, err)
		}
		tokens[i] = result(out)["token"].(float64)
	}

	before, err := scrapeReviews(ctx, env.Clientset)
	if err != nil {
		t.Fatal(err)
	}
	flood, stop := context.WithTimeout(ctx, floodFor)
	defer stop()
	var wg sync.WaitGroup
	var lost, renewErrors, renews atomic.Int64
	var slowest, longestGap atomic.Int64
	// Renew every second, with a 30 s TTL: a holder loses its lock only if
	// no renew gets through for 30 s.
	for i := range holders {
		wg.Go(func() {
			tok := tokens[i]
			lastRenewed := time.Now()
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for flood.Err() == nil {
				select {
				case <-flood.Done():
					return
				case <-tick.C:
				}
				start := time.Now()
				code, out, err := callRoute(holdTokens[i%holderIdentities], fmt.Sprintf(`{"operations":[{"op":"renew","name":"lock-%d","owner":"h%d","token":%d,"ttlSeconds":30}]}`, i, i, int64(tok)))
				if d := time.Since(start); d.Milliseconds() > slowest.Load() {
					slowest.Store(d.Milliseconds())
				}
				renews.Add(1)
				switch {
				case err != nil || code != 200:
					renewErrors.Add(1)
				case result(out)["renewed"] == true:
					tok = result(out)["token"].(float64)
					if gap := time.Since(lastRenewed).Milliseconds(); gap > longestGap.Load() {
						longestGap.Store(gap)
					}
					lastRenewed = time.Now()
				default:
					lost.Add(1)
					return
				}
			}
		})
	}

	// Four proven identities in four namespaces hold the route's pool with
	// bodiless calls, from their own addresses.
	for i := range poolHolders {
		_, tok := identity(fmt.Sprintf("flood-pool-%d", i))
		if code, _, err := callRoute(tok, `{"operations":[{"op":"get","name":"x"}]}`); err != nil || code != 200 {
			t.Fatalf("proving attacker %d: %d %v", i, code, err)
		}
		for range route.DefaultLimits().MaxCallsPerCaller {
			wg.Go(func() {
				for flood.Err() == nil {
					c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 3, byte(i+1))}}).DialContext(flood, "tcp", routeAddr)
					if err != nil {
						continue
					}
					context.AfterFunc(flood, func() { c.Close() })
					fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: q\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n", route.Path, tok, route.MaxBody)
					_, _ = io.Copy(io.Discard, c)
					c.Close()
				}
			})
		}
	}

	// The webhook port: a process of its own, at the lowest priority, so
	// that encrypting 7 MB bodies takes the cores only when the manager and
	// kube-apiserver leave them idle; a pod elsewhere in the cluster floods
	// with cores of its own, not the manager's.
	webhookAddr := net.JoinHostPort(wo.LocalServingHost, strconv.Itoa(wo.LocalServingPort))
	var attackOut bytes.Buffer
	attackCmd := exec.Command(os.Args[0], "-test.run=^TestWebhookAttacker$", "-test.v")
	attackCmd.Env = append(os.Environ(), attackerEnv+"="+webhookAddr, attackerForEnv+"="+floodFor.String())
	attackCmd.Stdout, attackCmd.Stderr = &attackOut, &attackOut
	attacker, err := child.Start(attackCmd, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Setpriority(syscall.PRIO_PROCESS, attacker.Pid, 19); err != nil {
		t.Logf("the attacker runs at normal priority: %v", err)
	}
	defer func() {
		if !attacker.Exited() {
			_ = syscall.Kill(-attacker.Pid, syscall.SIGKILL)
		}
		<-attacker.Done()
	}()

	// Throughout: a guarded write and a kubectl write of a permit every
	// 2 s, each of which the API server reviews through the webhooks.
	guardNS := holdNS
	var guardedOK, guardedFail, kubectlOK, kubectlFail atomic.Int64
	var failures []string
	var fmu sync.Mutex
	wg.Go(func() {
		for n := 0; flood.Err() == nil; n++ {
			code, out, err := callRoute(holdToken, fmt.Sprintf(`{"operations":[{"op":"acquire","name":"guard-%d","ttlSeconds":30,"owner":"g"}]}`, n))
			if err == nil && code == 200 && result(out)["acquired"] == true {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: guardNS, Name: fmt.Sprintf("guarded-%d", n),
					Labels:      map[string]string{permit.GuardedLabel: "true"},
					Annotations: map[string]string{permit.GuardAnnotation: fmt.Sprintf("guard-%d#0=%d", n, int64(result(out)["token"].(float64)))}}}
				if err := env.Client.Create(ctx, cm); err != nil {
					guardedFail.Add(1)
					fmu.Lock()
					failures = append(failures, "guarded write: "+err.Error())
					fmu.Unlock()
				} else {
					guardedOK.Add(1)
				}
			} else {
				guardedFail.Add(1)
				fmu.Lock()
				failures = append(failures, fmt.Sprintf("acquire for a guarded write: %d %v %v", code, out, err))
				fmu.Unlock()
			}
			manifest := fmt.Sprintf("apiVersion: locks.queen.dev/v1alpha1\nkind: QueenLock\nmetadata: {namespace: %s, name: %s}\nspec: {lock: kubectl-%d, slot: 0, limit: 1, owner: kubectl, ttlSeconds: 30}\n",
				guardNS, permit.Name(fmt.Sprintf("kubectl-%d", n), 0), n)
			kc := exec.Command(filepath.Join(root, "bin", "kubectl"), "--kubeconfig", kubeconfig, "create", "-f", "-")
			kc.Stdin = strings.NewReader(manifest)
			if out, err := kc.CombinedOutput(); err != nil {
				kubectlFail.Add(1)
				fmu.Lock()
				failures = append(failures, "kubectl: "+strings.TrimSpace(string(out)))
				fmu.Unlock()
			} else {
				kubectlOK.Add(1)
			}
			select {
			case <-flood.Done():
			case <-time.After(2 * time.Second):
			}
		}
	})
	wg.Wait()
	select {
	case <-attacker.Done():
	case <-time.After(time.Minute):
		t.Fatal("the webhook attacker did not stop after the flood")
	}
	refusedBig := attackerRefusals(t, attackOut.String())

	after, err := scrapeReviews(ctx, env.Clientset)
	if err != nil {
		t.Fatal(err)
	}
	rv := after.minus(before)

	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	var peak string
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			peak = strings.TrimSpace(strings.TrimPrefix(line, "VmHWM:"))
		}
	}
	kb, _ := strconv.Atoi(strings.TrimSuffix(peak, " kB"))
	t.Logf("renews sent %d of the %d a 1 s cadence would send; longest a holder went between two renews %d ms (TTL 30 s)",
		renews.Load(), int64(holders)*int64(floodFor/time.Second), longestGap.Load())
	t.Logf("flood of %s: renews %d (errors %d, slowest %d ms), holders lost %d; guarded writes %d ok, %d failed; kubectl permit writes %d ok, %d failed; webhook refusals seen by the flood %d; manager peak RSS %d MiB",
		floodFor, renews.Load(), renewErrors.Load(), slowest.Load(), lost.Load(), guardedOK.Load(), guardedFail.Load(), kubectlOK.Load(), kubectlFail.Load(), refusedBig, kb>>10)
	t.Logf("reviews kube-apiserver sent the webhooks during the flood: %.0f; answered within 2.5 s %.0f, within the 10 s timeout %.0f; without an answer %.0f",
		rv.sent, rv.withinTwo, rv.within, rv.failed)
	for _, f := range failures {
		t.Log(f)
	}
	if rv.sent == 0 {
		t.Error("kube-apiserver sent the webhooks no review during the flood: the writes that need them did not run")
	}
	if rv.failed != 0 || rv.within != rv.sent {
		t.Error("a review kube-apiserver sent was not answered within its timeout")
	}
	if lost.Load() != 0 || guardedFail.Load() != 0 || kubectlFail.Load() != 0 || kb>>10 >= 512 {
		t.Fatal("the flood took something away")
	}
}
