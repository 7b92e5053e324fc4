// Package flood holds the manager to a flood of its webhook port and its
// route beside live holders (issue 40). It runs bin/manager as a process of
// its own, so that its peak resident memory is the manager's alone, and
// only with QUEEN_LOCKS_FLOOD=1 (make flood): it takes minutes.
package flood

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
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

	flood, stop := context.WithTimeout(ctx, floodFor)
	defer stop()
	var wg sync.WaitGroup
	var lost, renewErrors, renews atomic.Int64
	var slowest atomic.Int64
	// Renew every second, with a 30 s TTL: a holder loses its lock only if
	// no renew gets through for 30 s.
	for i := range holders {
		wg.Go(func() {
			tok := tokens[i]
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

	// The webhook port: 7 MB bodies one byte short, half with their
	// length and half chunked, and dribblers of a byte every 5 s; each from
	// one of ten addresses, connecting again when cut off.
	webhookAddr := net.JoinHostPort(wo.LocalServingHost, strconv.Itoa(wo.LocalServingPort))
	tlsCfg := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the attacker does not care whom it floods
	body := bytes.Repeat([]byte("a"), bigBody)
	var refusedBig atomic.Int64
	for i := range bigBodies {
		wg.Go(func() {
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 4, byte(i%10+1))}}
			for flood.Err() == nil {
				c, err := tls.DialWithDialer(d, "tcp", webhookAddr, tlsCfg)
				if err != nil {
					continue
				}
				context.AfterFunc(flood, func() { c.Close() })
				if i%2 == 0 {
					fmt.Fprintf(c, "POST /validate-guarded HTTP/1.1\r\nHost: q\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", bigBody)
					_, _ = c.Write(body)
				} else {
					fmt.Fprintf(c, "POST /validate-guarded HTTP/1.1\r\nHost: q\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n", bigBody)
					_, _ = c.Write(body)
				}
				if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
					if resp.StatusCode >= 400 {
						refusedBig.Add(1)
					}
					resp.Body.Close()
				}
				c.Close()
				// Again after a second: the flood's own TLS encryption of
				// 7 MB bodies in a tight loop would take the machine's
				// cores from everything, the manager included, which is
				// not what a pod elsewhere could do to it.
				select {
				case <-flood.Done():
				case <-time.After(time.Second):
				}
			}
		})
	}
	for i := range dribblers {
		wg.Go(func() {
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 5, byte(i%10+1))}}
			for flood.Err() == nil {
				c, err := d.DialContext(flood, "tcp", webhookAddr)
				if err != nil {
					continue
				}
				context.AfterFunc(flood, func() { c.Close() })
				for err == nil && flood.Err() == nil {
					_, err = c.Write([]byte{0x16})
					select {
					case <-flood.Done():
					case <-time.After(5 * time.Second):
					}
				}
				c.Close()
			}
		})
	}

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
	t.Logf("flood of %s: renews %d (errors %d, slowest %d ms), holders lost %d; guarded writes %d ok, %d failed; kubectl permit writes %d ok, %d failed; webhook refusals seen by the flood %d; manager peak RSS %d MiB",
		floodFor, renews.Load(), renewErrors.Load(), slowest.Load(), lost.Load(), guardedOK.Load(), guardedFail.Load(), kubectlOK.Load(), kubectlFail.Load(), refusedBig.Load(), kb>>10)
	for _, f := range failures {
		t.Log(f)
	}
	if lost.Load() != 0 || guardedFail.Load() != 0 || kubectlFail.Load() != 0 || kb>>10 >= 512 {
		t.Fatal("the flood took something away")
	}
}
