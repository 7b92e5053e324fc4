package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/test/internal/procfs"
)

// The external section measures the route as users run it: the manager as
// make dev runs it (cmd/dev built and started as its own process, under
// its own ServiceAccount, gated pods on, the route on loopback), and the
// clients in a process of their own (this binary again, with -client),
// beside a Lease and the floor measured from that same clients' process.
// Nothing of it shares a Go process with another part: connection
// handling, HTTP/1.1 framing, JSON and scheduling across processes are
// paid where users pay them.

// extRounds is how many alternating rounds each row takes after its
// warm-up; the ratios are given as their median, least and most.
const extRounds = 3

// extNS is make dev's namespace: the route's default, where the
// Leases and the floor's objects go too.
const extNS = "default"

// extTimes is CPU time used by each process of the external section.
type extTimes struct {
	route, apiserver, etcd, clients time.Duration
}

func (t extTimes) minus(o extTimes) extTimes {
	return extTimes{t.route - o.route, t.apiserver - o.apiserver, t.etcd - o.etcd, t.clients - o.clients}
}

func (t extTimes) plus(o extTimes) extTimes {
	return extTimes{t.route + o.route, t.apiserver + o.apiserver, t.etcd + o.etcd, t.clients + o.clients}
}

// aboveIdle is t less what the processes use idle (per second) over secs.
func (t extTimes) aboveIdle(idle extTimes, secs float64) extTimes {
	sub := func(a, b time.Duration) time.Duration { return max(0, a-time.Duration(float64(b)*secs)) }
	return extTimes{sub(t.route, idle.route), sub(t.apiserver, idle.apiserver), sub(t.etcd, idle.etcd), sub(t.clients, idle.clients)}
}

// extPids are the processes of the external section.
type extPids struct{ route, apiserver, etcd, clients int }

func (p extPids) times() extTimes {
	c := func(pid int) time.Duration { return procCPU(strconv.Itoa(pid)) }
	return extTimes{c(p.route), c(p.apiserver), c(p.etcd), c(p.clients)}
}

func (p extPids) idleRate(d time.Duration) extTimes {
	before := p.times()
	time.Sleep(d)
	u := p.times().minus(before)
	per := func(x time.Duration) time.Duration { return time.Duration(float64(x) / d.Seconds()) }
	return extTimes{per(u.route), per(u.apiserver), per(u.etcd), per(u.clients)}
}

// devProcess is make dev's command running as its own process.
type devProcess struct {
	cmd       *exec.Cmd
	dir       string
	routeURL  string
	pprofURL  string
	cfg       *rest.Config // the administrator's, from its kubeconfig
	apiserver int
	etcd      int
}

// freeAddr is a loopback address with a port nobody listens on now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// startDev builds cmd/dev and starts it as make dev does, on free loopback
// ports, with its profiles served; it answers once the banner is out.
func startDev(dir string) (*devProcess, error) {
	bin := filepath.Join(dir, "queen-locks-dev")
	build := exec.Command("go", "build", "-o", bin, "./cmd/dev")
	build.Dir = controlplane.Root()
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building cmd/dev: %w\n%s", err, out)
	}
	routeAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	pprofAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "dev.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-route-address", routeAddr, "-dir", filepath.Join(dir, "dev"), "-pprof-address", pprofAddr)
	cmd.Dir = controlplane.Root()
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &devProcess{cmd: cmd, dir: dir, routeURL: "http://" + routeAddr + "/api/v1/locks", pprofURL: "http://" + pprofAddr}
	up := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		seen := false
		for sc.Scan() {
			fmt.Fprintln(logf, sc.Text())
			if !seen && strings.Contains(sc.Text(), "Ctrl-C stops it all") {
				seen = true
				up <- nil
			}
		}
		if !seen {
			up <- fmt.Errorf("make dev ended before it was up (its log: %s)", logf.Name())
		}
	}()
	select {
	case err = <-up:
	case <-time.After(5 * time.Minute):
		err = fmt.Errorf("make dev was not up within 5 minutes (its log: %s)", logf.Name())
	}
	if err != nil {
		d.stop()
		return nil, err
	}
	raw, err := os.ReadFile(filepath.Join(dir, "dev", "kubeconfig"))
	if err == nil {
		d.cfg, err = clientcmd.RESTConfigFromKubeConfig(raw)
	}
	if err == nil {
		d.cfg.QPS, d.cfg.Burst = -1, 0
		d.apiserver, d.etcd, err = childrenOf(cmd.Process.Pid)
	}
	if err != nil {
		d.stop()
		return nil, err
	}
	return d, nil
}

// stop ends make dev as Ctrl-C does, and waits until it has stopped its
// kube-apiserver and etcd.
func (d *devProcess) stop() {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		_ = d.cmd.Process.Kill()
		<-done
	}
}

// childrenOf finds the kube-apiserver and etcd that process pid started.
func childrenOf(pid int) (apiserver, etcd int, err error) {
	err = procfs.Each("stat", func(child int, raw []byte) bool {
		comm, ppid := statParent(string(raw))
		if ppid == pid {
			switch comm {
			case "kube-apiserver":
				apiserver = child
			case "etcd":
				etcd = child
			}
		}
		return true
	})
	if err == nil && (apiserver == 0 || etcd == 0) {
		err = fmt.Errorf("make dev's kube-apiserver (%d) and etcd (%d) were not found among its children", apiserver, etcd)
	}
	return apiserver, etcd, err
}

// statParent reads the command and the parent's pid from /proc/PID/stat:
// "PID (COMM) STATE PPID ...", where COMM may hold spaces and parentheses.
func statParent(stat string) (comm string, ppid int) {
	open, end := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
	if open < 0 || end < open {
		return "", 0
	}
	f := strings.Fields(stat[end+1:])
	if len(f) < 2 {
		return "", 0
	}
	ppid, _ = strconv.Atoi(f[1])
	return stat[open+1 : end], ppid
}

// floorIdentity makes the floor's ServiceAccount in ns, with the rights
// its clients need (the floor's objects in every namespace, for its
// informer; Leases in ns), and answers a token of it for kube-apiserver.
func floorIdentity(ctx context.Context, cs kubernetes.Interface, ns string) (string, error) {
	const name = "bench-floor"
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{floorGroup}, Resources: []string{"queenlocks"}, Verbs: []string{"create", "get", "list", "watch", "update", "patch", "delete"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create", "get", "update", "patch", "delete"}},
	}}
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, Subjects: subject,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	// The last verb the clients need; the authorizer sees the binding
	// within a moment.
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: serviceaccount.MakeUsername(ns, name), Groups: serviceaccount.MakeGroupNames(ns),
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "watch", Group: floorGroup, Resource: "queenlocks"},
	}}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		return err == nil && got.Status.Allowed, nil
	})
	if err != nil {
		return "", fmt.Errorf("the floor's role never took effect: %w", err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](24 * 3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("a token for %s: %w", name, err)
	}
	return tr.Status.Token, nil
}

// clientsProcess is the clients' process, as the benchmark drives it.
type clientsProcess struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *json.Decoder
}

// startClients starts this binary again as the clients' process.
func startClients(cfg clientConfig) (*clientsProcess, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-client")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &clientsProcess{cmd: cmd, in: in, out: json.NewDecoder(out)}
	if err := json.NewEncoder(in).Encode(cfg); err != nil {
		c.stop()
		return nil, err
	}
	var a clientAnswer
	if err := c.out.Decode(&a); err != nil || !a.Ready {
		c.stop()
		return nil, fmt.Errorf("the clients' process did not start: %v %s", err, a.Err) //nolint:errorlint // either may be empty
	}
	return c, nil
}

// do runs one command and answers its result.
func (c *clientsProcess) do(cmd clientCommand) (clientAnswer, error) {
	if err := json.NewEncoder(c.in).Encode(cmd); err != nil {
		return clientAnswer{}, err
	}
	var a clientAnswer
	if err := c.out.Decode(&a); err != nil {
		return clientAnswer{}, fmt.Errorf("the clients' process: %w", err)
	}
	if a.Err != "" {
		return a, fmt.Errorf("%s at %d clients: %s", cmd.Path, cmd.Conc, a.Err)
	}
	return a, nil
}

func (c *clientsProcess) stop() {
	_ = c.in.Close()
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// extRound is one path's share of one round.
type extRound struct {
	cycles int
	secs   float64
	lat    []time.Duration
	cpu    extTimes
}

func (r extRound) rate() float64 {
	if r.secs == 0 {
		return 0
	}
	return float64(r.cycles) / r.secs
}

// extRow is one path measured over the rounds.
type extRow struct {
	name   string
	conc   int
	rounds []extRound
}

func (r extRow) total() extRound {
	var t extRound
	for _, x := range r.rounds {
		t.cycles += x.cycles
		t.secs += x.secs
		t.lat = append(t.lat, x.lat...)
		t.cpu = t.cpu.plus(x.cpu)
	}
	return t
}

// ratios are r's rates to base's, round by round.
func (r extRow) ratios(base extRow) []float64 {
	var out []float64
	for i := range min(len(r.rounds), len(base.rounds)) {
		if b := base.rounds[i].rate(); b > 0 {
			out = append(out, r.rounds[i].rate()/b)
		}
	}
	return out
}

// spread is the median, least and most of some ratios.
type spread struct{ med, lo, hi float64 }

func spreadOf(xs []float64) spread {
	if len(xs) == 0 {
		return spread{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return spread{med, s[0], s[len(s)-1]}
}

func (s spread) String() string { return fmt.Sprintf("%.2f (%.2f to %.2f)", s.med, s.lo, s.hi) }

// extPath is a path of the clients' process and the row it makes.
type extPath struct{ path, name string }

var (
	extLease  = extPath{pathLease, "Lease create+delete"}
	extFloor  = extPath{pathFloor, "floor: QueenLock CRD copy create+delete, ServiceAccount token, one informer"}
	extHandle = extPath{pathHandle, "route: Go handle, shipped defaults"}
	extPlain  = extPath{pathPlain, "route: plain HTTP/1.1 keep-alive client"}

	extRenews = []extPath{
		{pathLease + renewSuffix, "Lease update"},
		{pathFloor + renewSuffix, "floor: QueenLock CRD copy update, ServiceAccount token, one informer"},
		{pathHandle + renewSuffix, "route renew: Go handle, shipped defaults"},
		{pathPlain + renewSuffix, "route renew: plain HTTP/1.1 keep-alive client"},
	}
)

// external runs the section.
type external struct {
	dev     *devProcess
	clients *clientsProcess
	pids    extPids
	idle    extTimes
	leg     time.Duration
}

// rows warms each path up, then runs extRounds rounds that take the paths
// in turn, each for x.leg, measuring every process's CPU around each.
func (x *external) rows(paths []extPath, conc int) ([]extRow, error) {
	rows := make([]extRow, len(paths))
	for i, p := range paths {
		rows[i] = extRow{name: p.name, conc: conc}
	}
	for round := -1; round < extRounds; round++ {
		for i, p := range paths {
			leg := x.leg
			if round < 0 {
				leg = min(leg, time.Second) // the warm-up, not counted
			}
			before := x.pids.times()
			a, err := x.clients.do(clientCommand{Path: p.path, Conc: conc, For: leg, Prefix: fmt.Sprintf("x%s%d-r%d", p.path, conc, round+1)})
			if err != nil {
				return nil, err
			}
			if round < 0 {
				continue
			}
			cpu := x.pids.times().minus(before).aboveIdle(x.idle, a.Secs)
			rows[i].rounds = append(rows[i].rounds, extRound{cycles: a.Cycles, secs: a.Secs, lat: a.Lat, cpu: cpu})
		}
	}
	return rows, nil
}

// extResult is what the section found against the route's targets as users run it.
type extResult struct {
	// The route's clients' cycles to the floor's, round by round, by
	// clients.
	handle, plain map[int]spread
}

// external measures the route as users run it.
func (bn *bench) external() error {
	dir, err := os.MkdirTemp("", "queen-bench-external-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	loadStart := procfs.LoadAvg()
	t0 := time.Now()
	dev, err := startDev(dir)
	if err != nil {
		return err
	}
	defer dev.stop()
	ctx := context.Background()
	if _, err := installFloorCRD(ctx, dev.cfg, extNS); err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(dev.cfg)
	if err != nil {
		return err
	}
	token, err := floorIdentity(ctx, cs, extNS)
	if err != nil {
		return err
	}
	clients, err := startClients(clientConfig{Route: dev.routeURL, Host: dev.cfg.Host, CAData: dev.cfg.CAData, Token: token, Namespace: extNS})
	if err != nil {
		return err
	}
	defer clients.stop()
	x := &external{dev: dev, clients: clients, leg: max(time.Second, bn.d/extRounds),
		pids: extPids{route: dev.cmd.Process.Pid, apiserver: dev.apiserver, etcd: dev.etcd, clients: clients.cmd.Process.Pid}}
	x.idle = x.pids.idleRate(5 * time.Second)

	b := &bn.b
	fmt.Fprintf(b, "\n## The route as users run it: clients in a process of their own\n\n"+
		"`make dev`'s own command, built and started as its own process: its control plane, the manager under its own ServiceAccount with its chart RBAC, gated pods on, "+
		"the route on loopback with `--auth=none`. The clients run in another process (this benchmark's binary started again with `-client`) and call the route over loopback: "+
		"the Go handle made with its shipped defaults (`handle.HTTP(url, handle.HTTPOptions{})`), and a plain HTTP/1.1 client that keeps one connection per client alive and writes each request whole, "+
		"as curl or a client in any language would, each from a loopback address of its own (127.0.1.N), as callers in separate pods are. From that same process, as floors: Leases, and the copy of the QueenLock CRD the cycles above use, "+
		"both written under a ServiceAccount of their own with a token (authentication and RBAC, as the manager writes), the floor's client running one informer on its CRD in every namespace, as the manager must. "+
		"Each row takes %d rounds of %s after a warm-up of a second, the paths in turn within each round; a ratio is taken round by round and given as its median (least to most). "+
		"CPU per cycle is read from /proc for the route's process (make dev's, which runs the manager, its webhooks and the route), its kube-apiserver and etcd, and the clients' process, "+
		"less what each used idle (5 s before the rows: %s, %s, %s and %s ms/s). Load average (1, 5, 15 min) at the start of this section: %s.\n\n",
		extRounds, x.leg, perCycle(x.idle.route, 1), perCycle(x.idle.apiserver, 1), perCycle(x.idle.etcd, 1), perCycle(x.idle.clients, 1), loadStart)

	res := extResult{handle: map[int]spread{}, plain: map[int]spread{}}
	fmt.Fprintf(b, "### Acquire + release cycles\n\n| path | clients | cycles/s | to the floor | to a Lease | p50 | p99 | CPU ms per cycle: route process | kube-apiserver | etcd | clients' process |\n|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|\n")
	paths := []extPath{extLease, extFloor, extHandle, extPlain}
	for _, conc := range []int{1, 8, 32} {
		rows, err := x.rows(paths, conc)
		if err != nil {
			return err
		}
		writeExtRows(b, rows)
		res.handle[conc], res.plain[conc] = spreadOf(rows[2].ratios(rows[1])), spreadOf(rows[3].ratios(rows[1]))
		if profileDir != "" && conc == 8 {
			for _, p := range []extPath{extFloor, extHandle} {
				if err := x.profile(p, conc); err != nil {
					return err
				}
			}
		}
	}

	fmt.Fprintf(b, "\n### Renews\n\nEach client holds one and renews it back to back, each renew conditional on the token the last answered: "+
		"the Lease by an update of the whole Lease (as client-go's leader election renews), the floor's object by the same update with the times written by the client, "+
		"the route's permits by its renew operation (one update, stamped by the manager).\n\n"+
		"| path | clients | renews/s | to the floor | to a Lease | p50 | p99 | CPU ms per renew: route process | kube-apiserver | etcd | clients' process |\n|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|\n")
	for _, conc := range []int{8, 32} {
		rows, err := x.rows(extRenews, conc)
		if err != nil {
			return err
		}
		writeExtRows(b, rows)
	}

	fmt.Fprintf(b, "\n### Handoffs to waiters\n\nWaiters in the clients' process woken by the route (`waitSeconds`), through one Go handle; as in the wake-up rows below: "+
		"each holds 20 ms, releases and rests 100 ms; a gap runs from a release's answer to the next acquire of that slot.\n\n"+
		"| row | samples | p50 | p99 |\n| --- | ---: | ---: | ---: |\n")
	for _, h := range []struct {
		name                   string
		limit, waiters, rounds int
	}{{"1 lock, 8 waiters", 1, 8, 100}, {"semaphore of 4, 16 waiters", 4, 16, 200}} {
		a, err := clients.do(clientCommand{Path: pathHandoff, Conc: 1, Prefix: fmt.Sprintf("xhandoff-%d", h.limit), Limit: h.limit, Waiters: h.waiters, Rounds: h.rounds})
		if err != nil {
			return err
		}
		fmt.Fprintf(b, "| handoff gap, %s | %d | %s | %s |\n", h.name, len(a.Lat), ms(percentile(a.Lat, 50)), ms(percentile(a.Lat, 99)))
	}
	fmt.Fprintf(b, "\nThe section took %s, make dev's start included; load average at its end: %s.\n", time.Since(t0).Round(time.Second), procfs.LoadAvg())
	bn.sum.external = &res
	return nil
}

// writeExtRows writes rows as table lines: rows[0] is the Lease, rows[1]
// the floor.
func writeExtRows(b io.Writer, rows []extRow) {
	for _, r := range rows {
		t := r.total()
		fmt.Fprintf(b, "| %s | %d | %.0f | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.name, r.conc, t.rate(),
			spreadOf(r.ratios(rows[1])), spreadOf(r.ratios(rows[0])), ms(percentile(t.lat, 50)), ms(percentile(t.lat, 99)),
			perCycle(t.cpu.route, t.cycles), perCycle(t.cpu.apiserver, t.cycles), perCycle(t.cpu.etcd, t.cycles), perCycle(t.cpu.clients, t.cycles))
	}
}

// profile runs p at conc clients for a row's time under CPU profiles of
// kube-apiserver, the route's process and the clients' process, and says
// what it measured.
func (x *external) profile(p extPath, conc int) error {
	d := extRounds * x.leg
	secs := fmt.Sprint(int(d.Seconds()))
	cs, err := kubernetes.NewForConfig(x.dev.cfg)
	if err != nil {
		return err
	}
	type answer struct {
		name string
		raw  []byte
		err  error
	}
	got := make(chan answer, 2)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
		defer cancel()
		raw, err := cs.Discovery().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", secs).DoRaw(ctx)
		got <- answer{"apiserver", raw, err}
	}()
	go func() {
		resp, err := http.Get(x.dev.pprofURL + "/debug/pprof/profile?seconds=" + secs)
		if err != nil {
			got <- answer{"route", nil, err}
			return
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		got <- answer{"route", raw, err}
	}()
	if err := os.MkdirAll(profileDir, 0o755); err != nil {
		return err
	}
	dir, err := filepath.Abs(profileDir)
	if err != nil {
		return err
	}
	before := x.pids.times()
	a, err := x.clients.do(clientCommand{Path: p.path, Conc: conc, For: d, Prefix: fmt.Sprintf("xprof%s%d", p.path, conc),
		Profile: filepath.Join(dir, fmt.Sprintf("external-%s-%d-clients.pprof", p.path, conc))})
	if err != nil {
		return err
	}
	cpu := x.pids.times().minus(before).aboveIdle(x.idle, a.Secs)
	for range 2 {
		g := <-got
		if g.err != nil {
			return fmt.Errorf("the %s's profile: %w", g.name, g.err)
		}
		if err := os.WriteFile(filepath.Join(profileDir, fmt.Sprintf("external-%s-%d-%s.pprof", p.path, conc, g.name)), g.raw, 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "\nprofiled %s at %d clients in their own process: %d cycles, %.0f/s; CPU ms per cycle: route process %s, kube-apiserver %s, etcd %s, clients' process %s\n",
		p.path, conc, a.Cycles, float64(a.Cycles)/a.Secs, perCycle(cpu.route, a.Cycles), perCycle(cpu.apiserver, a.Cycles), perCycle(cpu.etcd, a.Cycles), perCycle(cpu.clients, a.Cycles))
	return nil
}
