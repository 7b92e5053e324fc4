package monitoring

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/test/internal/loopback"
)

// releaseNamespace is where the chart's rules expect the manager: the
// namespace the rules file is rendered for. The scrape labels its target
// so, as the prometheus-operator labels a target with its pod's namespace.
const releaseNamespace = "queen-locks"

// await polls cond until it holds, failing the test with what after limit.
func await(t *testing.T, limit time.Duration, what func() string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, limit, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waiting %v: %s", limit, what())
	}
}

// prom is a Prometheus server this test started.
type prom struct {
	url string
	log *bytes.Buffer
}

type series struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`
}

// query runs an instant query, answering its series, or the error
// Prometheus gave.
func (p *prom) query(q string) ([]series, error) {
	var out struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := p.get("/api/v1/query?query="+url.QueryEscape(q), &out); err != nil {
		return nil, err
	}
	if out.Status != "success" {
		return nil, fmt.Errorf("%s: %s", q, out.Error)
	}
	if out.Data.ResultType != "vector" {
		return nil, fmt.Errorf("%s: a %s, not a vector", q, out.Data.ResultType)
	}
	var ss []series
	return ss, json.Unmarshal(out.Data.Result, &ss)
}

func (p *prom) get(path string, v any) error {
	resp, err := http.Get(p.url + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("%s answered %d %q: %w", path, resp.StatusCode, raw, err)
	}
	return nil
}

// startPrometheus runs Debian's prometheus on a free loopback port, with
// its own configuration and storage in a temporary directory, scraping
// every second the manager's metrics at target over HTTPS with the bearer
// token in tokenFile, and the API server's with the administrator's client
// certificate (as kube-prometheus-stack scrapes it, job apiserver), and
// evaluating the chart's rules. It stops when the test ends.
func startPrometheus(t *testing.T, env *controlplane.Env, target, tokenFile string) *prom {
	t.Helper()
	bin := tool(t, "prometheus")
	dir := t.TempDir()
	files := map[string][]byte{"ca.crt": env.Config.CAData, "admin.crt": env.Config.CertData, "admin.key": env.Config.KeyData}
	for name, data := range files {
		if len(data) == 0 {
			t.Fatalf("the control plane's client configuration has no %s", name)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	apiserver, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	cfg := map[string]any{
		"global":     map[string]any{"scrape_interval": "1s", "evaluation_interval": "1s"},
		"rule_files": []string{rulesFile},
		"scrape_configs": []any{map[string]any{
			"job_name": "queen-locks",
			"scheme":   "https",
			// As the chart's ServiceMonitor and PodMonitor: the metrics'
			// own namespace label (the locks') wins over the target's.
			"honor_labels":  true,
			"authorization": map[string]any{"credentials_file": tokenFile},
			// The manager signs its metrics certificate itself, as in the
			// chart, whose monitors do not verify it either.
			"tls_config":     map[string]any{"insecure_skip_verify": true},
			"static_configs": []any{map[string]any{"targets": []string{target}, "labels": map[string]string{"namespace": releaseNamespace}}},
		}, map[string]any{
			"job_name": "apiserver",
			"scheme":   "https",
			"tls_config": map[string]any{"ca_file": filepath.Join(dir, "ca.crt"),
				"cert_file": filepath.Join(dir, "admin.crt"), "key_file": filepath.Join(dir, "admin.key")},
			"static_configs": []any{map[string]any{"targets": []string{apiserver.Host}}},
		}},
	}
	raw, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(config, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	addr := loopback.FreeAddrT(t)
	p := &prom{url: "http://" + addr, log: &bytes.Buffer{}}
	cmd := exec.Command(bin, "--config.file="+config, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("prometheus's log:\n%s", p.log.String())
		}
	})
	await(t, time.Minute, func() string { return "prometheus to answer: " + p.log.String() }, func() bool {
		select {
		case <-exited:
			t.Fatalf("prometheus exited: %s", p.log.String())
		default:
		}
		_, err := p.query("up")
		return err == nil
	})
	return p
}

// scraperToken makes a ServiceAccount bound to the chart's
// queen-locks-metrics-reader ClusterRole, as the chart's PodMonitor's
// scraper is, and writes a token of it to a file.
func scraperToken(t *testing.T, env *controlplane.Env) string {
	t.Helper()
	ctx := context.Background()
	if err := env.ApplyFile("config/rbac/metrics_reader_role.yaml"); err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t, "monitoring")
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "prometheus"}}
	if err := env.Client.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: ns + "-prometheus"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "queen-locks-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: ns}}}
	if err := env.Client.Create(ctx, crb); err != nil {
		t.Fatal(err)
	}
	tr, err := env.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa.Name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

type result = map[string]any

// call posts one call to a route and answers its status and results.
func call(t *testing.T, u, token, ns string, ops ...string) (int, []result) {
	t.Helper()
	body := `{"namespace":"` + ns + `","operations":[` + strings.Join(ops, ",") + `]}`
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Results []result `json:"results"`
	}
	dec := json.NewDecoder(resp.Body)
	dec.UseNumber()
	_ = dec.Decode(&out)
	return resp.StatusCode, out.Results
}

// one makes a call of one operation that must answer 200.
func one(t *testing.T, u, token, ns, op string) result {
	t.Helper()
	code, rs := call(t, u, token, ns, op)
	if code != http.StatusOK || len(rs) != 1 {
		t.Fatalf("%s answered %d %v", op, code, rs)
	}
	return rs[0]
}

func tokenOf(t *testing.T, r result) string {
	t.Helper()
	n, ok := r["token"].(json.Number)
	if !ok {
		t.Fatalf("no token in %v", r)
	}
	return n.String()
}

// exercise takes, renews, loses, releases and lets expire locks, over the
// route as the chart runs it and over the API, so that every metric the
// alerts and the dashboard read has series: it answers the namespace whose
// permits stay overdue.
func exercise(t *testing.T, env *controlplane.Env) (overdueNS string) {
	t.Helper()
	ctx := context.Background()
	tp := env.Production(t, controlplane.TopologyOptions{Prefix: "mon"})
	ns, tok := tp.LockNS, tp.Token
	acquire := func(name, owner string, ttl, wait int) string {
		return fmt.Sprintf(`{"op":"acquire","name":%q,"owner":%q,"ttlSeconds":%d,"waitSeconds":%d}`, name, owner, ttl, wait)
	}
	a := one(t, tp.URL, tok, ns, acquire("report", "a", 60, 0))
	if a["acquired"] != true {
		t.Fatal(a)
	}
	if r := one(t, tp.URL, tok, ns, acquire("report", "b", 60, 0)); r["reason"] != "held" {
		t.Fatal(r)
	}
	if r := one(t, tp.URL, tok, ns, acquire("report", "b", 60, 1)); r["reason"] != "held" {
		t.Fatal(r)
	}
	r := one(t, tp.URL, tok, ns, fmt.Sprintf(`{"op":"renew","name":"report","token":%s,"owner":"a","ttlSeconds":60}`, tokenOf(t, a)))
	if r["renewed"] != true {
		t.Fatal(r)
	}
	renewed := tokenOf(t, r)
	for _, op := range []string{
		fmt.Sprintf(`{"op":"renew","name":"report","token":%s,"owner":"intruder","ttlSeconds":60}`, renewed),
		fmt.Sprintf(`{"op":"release","name":"report","token":%s,"owner":"intruder"}`, renewed),
		fmt.Sprintf(`{"op":"check","name":"report","expect":%s}`, tokenOf(t, a)),
	} {
		if r := one(t, tp.URL, tok, ns, op); r["reason"] != "lost" && r["reason"] != "kv_precondition" {
			t.Fatalf("%s: %v", op, r)
		}
	}
	if r := one(t, tp.URL, tok, ns, fmt.Sprintf(`{"op":"release","name":"report","token":%s,"owner":"a"}`, renewed)); r["released"] != true {
		t.Fatal(r)
	}
	// Expires: nobody renews it (a caller with no pod, so that only its
	// TTL can end it).
	devNS := env.Namespace(t, "mon-dev")
	dev, _ := env.ServeRoute(t, route.AuthNone, devNS)
	if r := one(t, dev, "", devNS, acquire("short", "a", 1, 0)); r["acquired"] != true {
		t.Fatal(r)
	}
	// Its holder pod goes: the route recorded the caller's pod.
	if r := one(t, tp.URL, tok, ns, acquire("pod-held", "a", 600, 0)); r["acquired"] != true {
		t.Fatal(r)
	}
	if err := env.Client.Delete(ctx, tp.Pod); err != nil {
		t.Fatal(err)
	}

	// Stuck: the controller may not delete; one permit stays overdue, and
	// another is taken over.
	overdueNS = env.Namespace(t, "mon-stuck")
	env.BlockPermitDeletes(t, overdueNS)
	l := locks.New(env.Client, nil, locks.WithGrace(env.Grace))
	for _, lock := range []string{"stuck", "handover"} {
		if a, err := l.Acquire(ctx, overdueNS, lock, "first", 1, 1); err != nil || !a.Acquired {
			t.Fatal(a, err)
		}
	}
	await(t, time.Minute, func() string { return "the takeover" }, func() bool {
		b, err := l.Acquire(ctx, overdueNS, "handover", "second", 600, 1)
		if err != nil {
			t.Fatal(err)
		}
		return b.Acquired
	})

	// 503: a route whose API server does not answer.
	gone := rest.CopyConfig(env.Config)
	gone.Host = "https://" + loopback.FreeAddrT(t)
	down, stop, err := env.StartRoute(gone, route.AuthNone, devNS)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if code, _ := call(t, down, "", devNS, acquire("unreachable", "a", 60, 0)); code != http.StatusServiceUnavailable {
		t.Fatalf("a route without its API server answered %d", code)
	}

	// 429: a route that takes one call at a time, busy with a waiting one.
	limits := route.DefaultLimits()
	limits.MaxCalls = 1
	busy, stop, err := env.StartRouteConfig(route.Config{Auth: route.AuthNone, DefaultNamespace: devNS, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if r := one(t, busy, "", devNS, acquire("busy", "a", 60, 0)); r["acquired"] != true {
		t.Fatal(r)
	}
	before := env.Waker.Waiting()
	var wg sync.WaitGroup
	wg.Go(func() { call(t, busy, "", devNS, acquire("busy", "b", 60, 2)) })
	await(t, 20*time.Second, func() string { return "the call to wait" }, func() bool { return env.Waker.Waiting() > before })
	if code, _ := call(t, busy, "", devNS, acquire("other", "a", 60, 0)); code != http.StatusTooManyRequests {
		t.Fatalf("a route with its one call slot taken answered %d", code)
	}
	wg.Wait()
	return overdueNS
}

var comparison = regexp.MustCompile(`(==|!=|>=|<=|>|<)`)

// everySeries rewrites an expression so that each of its comparisons keeps
// every series, as 0 or 1, instead of dropping the ones it does not hold
// for (PromQL's bool modifier): an alert's expression then answers series
// whenever the metrics it reads are there, firing or not. Label matchers
// ({...}) and strings are left alone.
func everySeries(expr string) string {
	var b strings.Builder
	depth, quoted := 0, false
	for i := 0; i < len(expr); i++ {
		c := expr[i]
		switch {
		case quoted:
			if c == '\\' && i+1 < len(expr) {
				b.WriteByte(c)
				i++
				c = expr[i]
			} else if c == '"' {
				quoted = false
			}
		case c == '"':
			quoted = true
		case c == '{':
			depth++
		case c == '}':
			depth--
		case depth == 0:
			if m := comparison.FindString(expr[i:min(i+2, len(expr))]); m != "" && strings.HasPrefix(expr[i:], m) {
				b.WriteString(m + " bool")
				i += len(m) - 1
				continue
			}
		}
		b.WriteByte(c)
	}
	return b.String()
}

var metricName = regexp.MustCompile(`\b(?:queen_locks|controller_runtime_webhook|leader_election|apiserver_admission_webhook)_[a-z_]+\b`)

// A real Prometheus scrapes a real manager (HTTPS, with the bearer token of
// a ServiceAccount bound to the metrics reader role) while locks are taken,
// renewed, lost, released, expired, freed by their pod going and taken
// over; then every alert's expression and every dashboard query answers
// series, every rule evaluates without error, and the alerts whose
// conditions the run created are pending.
func TestPrometheusReadsEveryAlertAndPanel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane and Prometheus")
	}
	tool(t, "prometheus")
	metricsAddr := loopback.FreeAddrT(t)
	env, err := controlplane.Start(controlplane.Options{MetricsAddr: metricsAddr, LeaderElectionNamespace: "default"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	select {
	case <-env.Manager.Elected():
	case <-time.After(time.Minute):
		t.Fatal("the manager was not elected")
	}
	p := startPrometheus(t, env, metricsAddr, scraperToken(t, env))
	await(t, time.Minute, func() string { return "the scrapes of the manager and the API server to succeed" }, func() bool {
		s, err := p.query(`up == 1`)
		return err == nil && len(s) == 2
	})
	overdueNS := exercise(t, env)

	// What the run did shows in Prometheus, each way a holding ends and
	// each kind of answer.
	for _, q := range []string{
		`queen_locks_hold_seconds_count{end="released"} > 0`,
		`queen_locks_hold_seconds_count{end="expired"} > 0`,
		`queen_locks_hold_seconds_count{end="pod-gone"} > 0`,
		fmt.Sprintf(`queen_locks_hold_seconds_count{end="taken-over",namespace=%q} == 1`, overdueNS),
		`queen_locks_route_acquire_wait_seconds_count{outcome="acquired",waited="false"} > 0`,
		`queen_locks_route_acquire_wait_seconds_count{outcome="held",waited="true"} > 0`,
		`queen_locks_route_acquire_wait_seconds_count{outcome="error"} > 0`,
		`queen_locks_route_losses_total{op="renew",reason="lost"} == 1`,
		`queen_locks_route_losses_total{op="release",reason="lost"} == 1`,
		`queen_locks_route_losses_total{op="check",reason="kv_precondition"} == 1`,
		`queen_locks_route_request_duration_seconds_count{code="503"} > 0`,
		`queen_locks_route_request_duration_seconds_count{code="429"} > 0`,
		fmt.Sprintf(`queen_locks_permits_overdue{namespace=%q} == 1`, overdueNS),
		`queen_locks_expirations_total > 0`,
		`queen_locks_releases_total{reason="pod-gone"} > 0`,
		fmt.Sprintf(`leader_election_master_status{name="queen-locks-expiry.locks.queen.dev",namespace=%q} == 1`, releaseNamespace),
		`queen_locks_holder_pods_named == on() queen_locks_holder_pods_followed`,
	} {
		var got []series
		await(t, time.Minute, func() string { return fmt.Sprintf("%s: %v", q, got) }, func() bool {
			got, err = p.query(q)
			return err == nil && len(got) > 0
		})
	}

	queries := map[string]string{}
	for name, expr := range alertExprs(t) {
		queries["alert "+name] = everySeries(expr)
	}
	for panel, expr := range panelQueries(t) {
		expr = strings.NewReplacer("$namespace", ".*", "$__rate_interval", "1m").Replace(expr)
		queries["panel "+panel] = expr
	}
	queries["dashboard variable namespace"] = `count by (namespace) (queen_locks_permits_held)`
	names := map[string]bool{}
	for _, q := range queries {
		for _, n := range metricName.FindAllString(q, -1) {
			names[n] = true
		}
	}
	// Each metric a query names exists: a misspelt name answers no series
	// rather than an error.
	for n := range names {
		q := fmt.Sprintf(`count({__name__=%q})`, n)
		var got []series
		await(t, time.Minute, func() string { return fmt.Sprintf("metric %s: %v", n, got) }, func() bool {
			got, err = p.query(q)
			return err == nil && len(got) == 1
		})
	}
	keys := make([]string, 0, len(queries))
	for k := range queries {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		var got []series
		var qerr error
		await(t, time.Minute, func() string { return fmt.Sprintf("%s (%s) to answer series: %v %v", k, queries[k], got, qerr) }, func() bool {
			got, qerr = p.query(queries[k])
			return qerr == nil && len(got) > 0
		})
	}

	// The rules Prometheus evaluates are healthy, and the run's conditions
	// show: overdue permits and lost renews are pending alerts (their for
	// has not passed), while a leader runs and no NoLeader is.
	var rules struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name, Health, LastError string
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := p.get("/api/v1/rules", &rules); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range rules.Data.Groups {
		for _, r := range g.Rules {
			n++
			if r.Health != "ok" {
				t.Errorf("rule %s: %s %s", r.Name, r.Health, r.LastError)
			}
		}
	}
	if want := len(alertNames(t)); n != want {
		t.Errorf("prometheus evaluates %d rules, want %d", n, want)
	}
	alertState := func(name string, labels map[string]string) string {
		var alerts struct {
			Data struct {
				Alerts []struct {
					Labels map[string]string `json:"labels"`
					State  string            `json:"state"`
				} `json:"alerts"`
			} `json:"data"`
		}
		if err := p.get("/api/v1/alerts", &alerts); err != nil {
			t.Fatal(err)
		}
	next:
		for _, a := range alerts.Data.Alerts {
			if a.Labels["alertname"] != name {
				continue
			}
			for k, v := range labels {
				if a.Labels[k] != v {
					continue next
				}
			}
			return a.State
		}
		return ""
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
	}{{"QueenLocksPermitsOverdue", map[string]string{"namespace": overdueNS}}, {"QueenLocksRenewsFailing", nil}} {
		await(t, time.Minute, func() string { return c.name + " to be pending" }, func() bool {
			return alertState(c.name, c.labels) == "pending"
		})
	}
	if s := alertState("QueenLocksNoLeader", nil); s != "" {
		t.Errorf("QueenLocksNoLeader is %s while the manager leads", s)
	}
}

// alertExprs answers each alert of the chart's rules file with its
// expression.
func alertExprs(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" { // not a recording rule
				out[r.Alert] = r.Expr
			}
		}
	}
	return out
}
