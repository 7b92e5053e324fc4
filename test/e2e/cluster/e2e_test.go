package cluster_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

const (
	release     = "queen-locks"
	releaseNS   = "queen-locks"
	serviceName = "queen-locks.queen-locks.svc" // as examples/cronjob names the route
	leaseName   = "queen-locks-expiry.locks.queen.dev"
	reportImage = "queen-locks.test/e2e/report:1"
	holderNS    = "team-e2e"
	cronNS      = "team-a" // examples/cronjob's
	holderSA    = "e2e-holder"
	audience    = "queen-locks"
	caConfigMap = "queen-locks-ca" // where the chart publishes the route's CA
)

var queenlocks = schema.GroupVersionResource{Group: "locks.queen.dev", Version: "v1alpha1", Resource: "queenlocks"}

// installed is set once the chart is up; later tests need it.
var installed bool

func helm(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	out, err := c.Tool(ctx, filepath.Join(bin, "helm"), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func await(t *testing.T, what string, timeout time.Duration, cond func(context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, cond); err != nil {
		t.Fatalf("waiting until %s: %v", what, err)
	}
}

func needInstall(t *testing.T) {
	t.Helper()
	if !installed {
		t.Skip("the chart is not installed (TestInstall failed)")
	}
}

// managerImage is the name make image gives the manager's image.
func managerImage(t *testing.T) (repo, tag string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "charts", "queen-locks", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		t.Fatal(err)
	}
	return "ghcr.io/queen-locks/queen-locks", chart.AppVersion
}

func managerPods(t *testing.T, ctx context.Context) []corev1.Pod {
	t.Helper()
	l, err := c.Client.CoreV1().Pods(releaseNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=queen-locks"})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func ready(p corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// leader is the pod holding the expiry controller's Lease, and how many
// times the Lease changed hands.
func leader(t *testing.T, ctx context.Context) (pod string, transitions int32) {
	t.Helper()
	l, err := c.Client.CoordinationV1().Leases(releaseNS).Get(ctx, leaseName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", 0
	}
	if err != nil {
		t.Fatal(err)
	}
	if l.Spec.HolderIdentity == nil {
		return "", ptr.Deref(l.Spec.LeaseTransitions, 0)
	}
	// controller-runtime's identity is the pod's hostname, "_", a UUID.
	pod, _, _ = strings.Cut(*l.Spec.HolderIdentity, "_")
	return pod, ptr.Deref(l.Spec.LeaseTransitions, 0)
}

func clusterIP(t *testing.T, ctx context.Context) string {
	t.Helper()
	svc, err := c.Client.CoreV1().Services(releaseNS).Get(ctx, release, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc.Spec.ClusterIP
}

// route is how to reach the lock route: through its Service's ClusterIP
// (kube-proxy's rules), over TLS with the CA the release publishes when it
// publishes one, as a pod without DNS reaches it.
type route struct {
	url    string
	scheme string // of the Service's name, for pods
	client *http.Client
}

func routeOf(t *testing.T, ctx context.Context) route {
	t.Helper()
	r := route{scheme: "http", client: http.DefaultClient}
	cm, err := c.Client.CoreV1().ConfigMaps(releaseNS).Get(ctx, caConfigMap, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if err == nil {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(cm.Data["ca.crt"])) {
			t.Fatalf("ConfigMap %s/%s holds no CA certificate in ca.crt", releaseNS, caConfigMap)
		}
		r.scheme = "https"
		r.client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: serviceName}}}
	}
	r.url = r.scheme + "://" + clusterIP(t, ctx) + ":6632/api/v1/locks"
	return r
}

// holder makes a namespace whose ServiceAccount holds locks (the chart's
// queen-locks-holder role), once.
var holderOnce sync.Once

func makeHolder(t *testing.T, ctx context.Context) {
	t.Helper()
	var err error
	holderOnce.Do(func() {
		cs := c.Client
		if _, err = cs.CoreV1().ServiceAccounts(holderNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: holderSA}}, metav1.CreateOptions{}); err != nil {
			return
		}
		_, err = cs.RbacV1().RoleBindings(holderNS).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e-holder-locks"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "queen-locks-holder"},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: holderSA, Namespace: holderNS}},
		}, metav1.CreateOptions{})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// holderToken is a ServiceAccount token of audience queen-locks for the
// holder, as a projected volume would give a pod.
func holderToken(t *testing.T, ctx context.Context) string {
	t.Helper()
	tr, err := c.Client.CoreV1().ServiceAccounts(holderNS).CreateToken(ctx, holderSA, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

type result struct {
	Acquired  bool      `json:"acquired"`
	Token     uint64    `json:"token"`
	Reason    string    `json:"reason"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// call sends operations to the route as the holder.
func call(t *testing.T, ctx context.Context, r route, token string, ops ...map[string]any) []result {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"operations": ops})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatalf("calling the route through its Service: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var answer struct{ Results []result }
	if err := json.Unmarshal(b, &answer); err != nil || resp.StatusCode != http.StatusOK || len(answer.Results) != len(ops) {
		t.Fatalf("route: HTTP %d %s (%v)", resp.StatusCode, b, err)
	}
	return answer.Results
}

func logs(t *testing.T, ctx context.Context, ns, pod string) string {
	t.Helper()
	b, err := c.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("logs of %s/%s: %v", ns, pod, err)
	}
	return string(b)
}

// TestInstall: helm install with the built image; both replicas Ready, one
// leader; the webhooks answer through the Service; a pod with the holder
// role acquires through the route's Service with its token.
func TestInstall(t *testing.T) {
	ctx := context.Background()
	repo, tag := managerImage(t)
	// The namespaces of the callers exist first, for the chart to copy the
	// route's CA into (route.tls.caNamespaces).
	for _, ns := range []string{holderNS, cronNS} {
		if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	helm(t, ctx, "install", release, filepath.Join(root, "charts", "queen-locks"), "-n", releaseNS, "--create-namespace",
		"--set", "image.repository="+repo, "--set", "image.tag="+tag, "--set", "image.pullPolicy=Never",
		"--set", "route.tls.caNamespaces={"+holderNS+","+cronNS+"}",
		"--set", "gatedPods.enabled=true",
		"--wait", "--timeout", "5m")
	t.Logf("helm install --wait took %s", time.Since(start).Round(time.Second))

	await(t, "both replicas are Ready", 3*time.Minute, func(ctx context.Context) (bool, error) {
		pods := managerPods(t, ctx)
		n := 0
		for _, p := range pods {
			if ready(p) {
				n++
			}
		}
		return n == 2 && len(pods) == 2, nil
	})
	var lead string
	await(t, "one replica leads", 2*time.Minute, func(ctx context.Context) (bool, error) {
		lead, _ = leader(t, ctx)
		return lead != "", nil
	})
	found := false
	for _, p := range managerPods(t, ctx) {
		found = found || p.Name == lead
	}
	if !found {
		t.Fatalf("the Lease names %q, which is no manager pod", lead)
	}
	installed = true

	// A guarded write without a guard: the API server asks the guard
	// webhooks through the Service, and a webhook itself refuses it (not
	// the API server because the webhook could not be reached). Ready pods
	// are not yet a Service that answers: kube-proxy programs the Service's
	// endpoints a moment later, and until then the call is refused at the
	// Service's address.
	var err error
	await(t, "the webhooks answer through their Service", time.Minute, func(ctx context.Context) (bool, error) {
		_, err = c.Client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "guarded", Labels: map[string]string{"locks.queen.dev/guarded": "true"}},
		}, metav1.CreateOptions{})
		return err == nil || !strings.Contains(err.Error(), "failed calling webhook"), nil
	})
	if err == nil || !strings.Contains(err.Error(), `guarded.locks.queen.dev" denied the request`) || !strings.Contains(err.Error(), "kv_precondition") {
		t.Errorf("a guarded ConfigMap without a guard: %v; want the guard webhook's kv_precondition refusal", err)
	}

	// A pod with the holder role acquires through the Service with its
	// projected token: the route reviews the token, the API server calls
	// the mutating webhook to admit the QueenLock.
	makeHolder(t, ctx)
	ip := clusterIP(t, ctx)
	rt := routeOf(t, ctx)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "holder"},
		Spec: corev1.PodSpec{
			ServiceAccountName:           holderSA,
			AutomountServiceAccountToken: ptr.To(false),
			RestartPolicy:                corev1.RestartPolicyNever,
			HostAliases:                  []corev1.HostAlias{{IP: ip, Hostnames: []string{serviceName}}},
			Containers: []corev1.Container{{
				Name:            "acquire",
				Image:           reportImage,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"/queenlock", "acquire", "e2e-pod-lock", "--ttl", "600s", "--owner", "holder-pod"},
				Env:             []corev1.EnvVar{{Name: "QUEEN_LOCKS_URL", Value: "http://" + serviceName + ":6632"}},
				VolumeMounts:    []corev1.VolumeMount{{Name: "token", MountPath: "/var/run/secrets/queen-locks", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
					Audience: audience, ExpirationSeconds: ptr.To[int64](3600), Path: "token"}}},
			}}}},
		},
	}
	ctr := &pod.Spec.Containers[0]
	ctr.Env[0].Value = rt.scheme + "://" + serviceName + ":6632"
	if rt.scheme == "https" {
		// The chart copied its CA into the namespace (route.tls.caNamespaces).
		ctr.Env = append(ctr.Env, corev1.EnvVar{Name: "QUEEN_LOCKS_CA_FILE", Value: "/etc/queen-locks/ca.crt"})
		ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: "ca", MountPath: "/etc/queen-locks", ReadOnly: true})
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "ca", VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: caConfigMap}}}})
	}
	if _, err := c.Client.CoreV1().Pods(holderNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var phase corev1.PodPhase
	await(t, "the holder pod has finished", 3*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(holderNS).Get(ctx, "holder", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		phase = p.Status.Phase
		return phase == corev1.PodSucceeded || phase == corev1.PodFailed, nil
	})
	out := logs(t, ctx, holderNS, "holder")
	var r result
	if err := json.Unmarshal([]byte(out), &r); phase != corev1.PodSucceeded || err != nil || !r.Acquired || r.Token == 0 {
		t.Fatalf("the holder pod %s; its output:\n%s", phase, out)
	}
	// The route recorded the pod as the permit's holder (from its
	// pod-bound token), and the pod has finished: the leader frees the
	// permit at once, not 600 s later, and says so with an event.
	dyn := dynamic.NewForConfigOrDie(c.Rest)
	var owners map[string]string
	await(t, "the finished holder pod's permit to be freed", time.Minute, func(ctx context.Context) (bool, error) {
		l, err := dyn.Resource(queenlocks).Namespace(holderNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		owners = map[string]string{}
		for _, item := range l.Items {
			owner, _, _ := unstructured.NestedString(item.Object, "spec", "owner")
			owners[owner] = item.GetResourceVersion()
		}
		_, held := owners["holder-pod"]
		return !held, nil
	})
	await(t, "a HolderPodGone event", time.Minute, func(ctx context.Context) (bool, error) {
		evs, err := c.Client.EventsV1().Events(holderNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == "HolderPodGone" && strings.Contains(e.Note, "holder") {
				return true, nil
			}
		}
		return false, nil
	})
}

// TestLeaderFailover: delete the leader pod; the other replica takes over
// expiry within the leader-election timing, and no permit is deleted
// before it expired.
func TestLeaderFailover(t *testing.T) {
	needInstall(t)
	ctx := context.Background()
	makeHolder(t, ctx)
	rt, token := routeOf(t, ctx), holderToken(t, ctx)
	old, transitions := leader(t, ctx)
	if old == "" {
		t.Fatal("no leader")
	}

	// Watch every permit's deletion from before the first acquire.
	dyn := dynamic.NewForConfigOrDie(c.Rest).Resource(queenlocks).Namespace(holderNS)
	list, err := dyn.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := dyn.Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	// Permits that expire before, during and after the handover.
	const n = 8
	expires := map[string]time.Time{}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("failover-%d", i)
		rs := call(t, ctx, rt, token, map[string]any{"op": "acquire", "name": name, "ttlSeconds": 3 + 4*i, "owner": "failover-test"})
		if !rs[0].Acquired {
			t.Fatalf("acquire %s: %+v", name, rs[0])
		}
		expires[name] = rs[0].ExpiresAt
	}

	deleted := time.Now()
	if err := c.Client.CoreV1().Pods(releaseNS).Delete(ctx, old, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var lead string
	await(t, "another replica leads", 2*time.Minute, func(ctx context.Context) (bool, error) {
		var tr int32
		lead, tr = leader(t, ctx)
		return lead != "" && lead != old && tr > transitions, nil
	})
	// controller-runtime's defaults: a 15 s lease, retried every 2 s; the
	// old leader releases it when stopped, so the handover takes less, but
	// never more than the old pod's 30 s grace plus one lease.
	took := time.Since(deleted)
	t.Logf("leader %s -> %s after %s", old, lead, took.Round(100*time.Millisecond))
	if took > 30*time.Second+15*time.Second+2*time.Second {
		t.Errorf("the handover took %s, longer than the grace period plus one lease", took)
	}

	// Every permit is deleted by the controller, never before it expired.
	timeout := time.After(time.Duration(3+4*n)*time.Second + 2*time.Minute)
	for len(expires) > 0 {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch ended")
			}
			if ev.Type != watch.Deleted {
				continue
			}
			at := time.Now()
			u := ev.Object.(*unstructured.Unstructured)
			lock, _, _ := unstructured.NestedString(u.Object, "spec", "lock")
			exp, ok := expires[lock]
			if !ok {
				continue
			}
			delete(expires, lock)
			if at.Before(exp) {
				t.Errorf("%s was deleted at %s, before it expired at %s", lock, at.Format(time.RFC3339Nano), exp.Format(time.RFC3339Nano))
			}
		case <-timeout:
			t.Fatalf("permits never deleted after they expired: %v", expires)
		}
	}

	await(t, "both replicas are Ready again", 3*time.Minute, func(ctx context.Context) (bool, error) {
		n := 0
		for _, p := range managerPods(t, ctx) {
			if ready(p) {
				n++
			}
		}
		return n == 2, nil
	})
}

// reportLine is one line of test/e2e/report's output.
type reportLine struct {
	Event string    `json:"event"`
	Pod   string    `json:"pod"`
	Token string    `json:"token"`
	At    time.Time `json:"at"`
}

// TestCronJob: examples/cronjob every minute with a job that runs longer
// than a minute. Over several schedules two runs never overlap (from the
// pods' own output), and a run that finds the lock held exits 0. Then the
// garbage collector removes the Jobs and pods with the CronJob.
func TestCronJob(t *testing.T) {
	needInstall(t)
	ctx := context.Background()
	const ns = cronNS
	if _, err := c.Kubectl(ctx, bin, "apply", "-f", filepath.Join(root, "examples", "cronjob", "rbac.yaml")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "examples", "cronjob", "cronjob.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cj batchv1.CronJob
	if err := yaml.UnmarshalStrict(b, &cj); err != nil {
		t.Fatal(err)
	}
	// What the test changes in the example, and why:
	// every minute, so several schedules pass in a few minutes;
	cj.Spec.Schedule = "* * * * *"
	// Allow, so that the CronJob controller does start a run while the last
	// one still works, and the lock is what keeps them apart (Forbid would
	// never let them meet);
	cj.Spec.ConcurrencyPolicy = batchv1.AllowConcurrent
	// keep every Job, to read every pod's output;
	cj.Spec.SuccessfulJobsHistoryLimit = ptr.To[int32](20)
	cj.Spec.FailedJobsHistoryLimit = ptr.To[int32](20)
	// the e2e image (queenlock and a report that runs 75 s), imported;
	// and the route's name through hostAliases, as no DNS server runs.
	spec := &cj.Spec.JobTemplate.Spec.Template.Spec
	spec.HostAliases = append(spec.HostAliases, corev1.HostAlias{IP: clusterIP(t, ctx), Hostnames: []string{serviceName}})
	ctr := &spec.Containers[0]
	ctr.Image, ctr.ImagePullPolicy = reportImage, corev1.PullNever
	job := -1
	for i, a := range ctr.Command {
		if a == "--" {
			job = i + 1
		}
	}
	if job < 0 || job >= len(ctr.Command) {
		t.Fatalf("examples/cronjob/cronjob.yaml: no `-- JOB` in the command %q", ctr.Command)
	}
	ctr.Command = append(ctr.Command[:job:job], "/report", "--for=75s")
	if ns != cj.Namespace {
		t.Fatalf("the example's namespace is %q, want %q", cj.Namespace, ns)
	}
	if _, err := c.Client.BatchV1().CronJobs(ns).Create(ctx, &cj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("CronJob %s every minute: %q", cj.Name, ctr.Command)

	// Wait for three finished runs past the first: run, skip, run at least.
	type outcome struct {
		pod   string
		ran   []reportLine
		out   string
		phase corev1.PodPhase
	}
	seen := map[string]outcome{}
	await(t, "the CronJob has run at least twice and skipped at least once", 8*time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if _, done := seen[p.Name]; done || (p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed) {
				continue
			}
			o := outcome{pod: p.Name, phase: p.Status.Phase, out: logs(t, ctx, ns, p.Name)}
			sc := bufio.NewScanner(strings.NewReader(o.out))
			for sc.Scan() {
				var l reportLine
				if json.Unmarshal(sc.Bytes(), &l) == nil && l.Event != "" {
					o.ran = append(o.ran, l)
				}
			}
			seen[p.Name] = o
			t.Logf("%s %s: %s", p.Name, p.Status.Phase, strings.TrimSpace(o.out))
			if o.phase == corev1.PodFailed {
				// Ran or skipped, a pod exits 0: no need to wait for more.
				return false, fmt.Errorf("%s failed; its output:\n%s", p.Name, o.out)
			}
		}
		runs, skips := 0, 0
		for _, o := range seen {
			if len(o.ran) > 0 {
				runs++
			} else {
				skips++
			}
		}
		return runs >= 2 && skips >= 1, nil
	})

	type run struct {
		pod        string
		start, end time.Time
		token      uint64
	}
	var runs []run
	for _, o := range seen {
		if o.phase != corev1.PodSucceeded {
			t.Errorf("%s: %s, want Succeeded (exit 0) whether it ran or found the lock held; output:\n%s", o.pod, o.phase, o.out)
			continue
		}
		if len(o.ran) == 0 {
			continue
		}
		if len(o.ran) != 2 || o.ran[0].Event != "start" || o.ran[1].Event != "end" {
			t.Errorf("%s: the report printed %+v, want a start and an end", o.pod, o.ran)
			continue
		}
		tok, err := strconv.ParseUint(o.ran[0].Token, 10, 64)
		if err != nil {
			t.Errorf("%s: QUEEN_LOCK_TOKEN %q: %v", o.pod, o.ran[0].Token, err)
		}
		runs = append(runs, run{pod: o.pod, start: o.ran[0].At, end: o.ran[1].At, token: tok})
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].start.Before(runs[j].start) })
	for i := 1; i < len(runs); i++ {
		a, b := runs[i-1], runs[i]
		if b.start.Before(a.end) {
			t.Errorf("two runs at once: %s ran %s to %s, %s started at %s", a.pod, a.start.Format(time.RFC3339Nano), a.end.Format(time.RFC3339Nano), b.pod, b.start.Format(time.RFC3339Nano))
		}
		if b.token <= a.token {
			t.Errorf("the token went from %d (%s) to %d (%s); it only grows", a.token, a.pod, b.token, b.pod)
		}
	}

	// The garbage collector: deleting the CronJob deletes its Jobs, and
	// theirs their pods.
	if err := c.Client.BatchV1().CronJobs(ns).Delete(ctx, cj.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	await(t, "the garbage collector removed the CronJob's Jobs and pods", 3*time.Minute, func(ctx context.Context) (bool, error) {
		jobs, err := c.Client.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return len(jobs.Items) == 0 && len(pods.Items) == 0, nil
	})
}
