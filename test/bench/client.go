package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/pprof"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap/zapcore"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/routeapi"
)

// The external clients run in a process of their own, as every caller of
// the route does: the benchmark starts its own binary again with -client,
// tells it on stdin where the route and kube-apiserver are, and then, one
// line at a time, which path to run at how many clients for how long. It
// answers each line with one line: the cycles done and their latencies.
// The benchmark measures the CPU of every process around each line.

// clientConfig is the first line the clients' process reads.
type clientConfig struct {
	Route     string `json:"route"`     // the route's URL, as make dev serves it
	Host      string `json:"host"`      // kube-apiserver
	CAData    []byte `json:"caData"`    // its CA
	Token     string `json:"token"`     // the floor's ServiceAccount token
	Namespace string `json:"namespace"` // of the Leases and the floor's objects; the route's default
}

// clientCommand is one measurement.
type clientCommand struct {
	Path   string        `json:"path"` // one of clientPaths, or "handoff"
	Conc   int           `json:"conc"`
	For    time.Duration `json:"for"`
	Prefix string        `json:"prefix"` // of the names this measurement uses
	// For "handoff": the lock's limit, its waiters, the acquires to see.
	Limit, Waiters, Rounds int
	// Profile, when set, is a file for a CPU profile of this process
	// over the measurement.
	Profile string `json:"profile,omitempty"`
}

// clientAnswer is what one measurement did.
type clientAnswer struct {
	Ready  bool            `json:"ready,omitempty"`
	Cycles int             `json:"cycles"`
	Secs   float64         `json:"secs"`
	Lat    []time.Duration `json:"lat"`
	Err    string          `json:"err,omitempty"`
}

// Paths the clients' process runs. Each is a cycle (acquire and release,
// or create and delete) unless it ends in -renew: then each client holds
// one and renews it over and over.
const (
	pathLease   = "lease"  // Lease create+delete, under the floor's ServiceAccount
	pathFloor   = "floor"  // the floor CRD's object create+delete, with the floor's informer running
	pathHandle  = "handle" // the Go handle over the route, its shipped defaults
	pathPlain   = "plain"  // one kept-alive HTTP/1.1 connection per client, as curl or any language's client
	renewSuffix = "-renew"
	pathHandoff = "handoff" // waiters woken by the route (waitSeconds), through the Go handle
)

// maxClients is the most clients a measurement runs.
const maxClients = 32

// clientProc is the state of the clients' process.
type clientProc struct {
	ns      string
	cs      kubernetes.Interface
	floor   client.Client
	handles []handle.Transport
	plain   []*plainClient
}

// runClients is the clients' process: it answers commands from in on out
// until in ends.
func runClients(in io.Reader, out io.Writer) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	enc := json.NewEncoder(out)
	if !sc.Scan() {
		return fmt.Errorf("no configuration on stdin")
	}
	var cfg clientConfig
	if err := json.Unmarshal(sc.Bytes(), &cfg); err != nil {
		return fmt.Errorf("the configuration: %w", err)
	}
	cp, stop, err := newClientProc(cfg)
	if err != nil {
		_ = enc.Encode(clientAnswer{Err: err.Error()})
		return err
	}
	defer stop()
	if err := enc.Encode(clientAnswer{Ready: true}); err != nil {
		return err
	}
	for sc.Scan() {
		var c clientCommand
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return fmt.Errorf("a command: %w", err)
		}
		a := cp.profiled(c)
		if err := enc.Encode(a); err != nil {
			return err
		}
	}
	return sc.Err()
}

func newClientProc(cfg clientConfig) (*clientProc, func(), error) {
	// The floor's client: a ServiceAccount's token over TLS, as the
	// manager authenticates, with no client-side rate limit, as the
	// manager's client has none either.
	rc := &rest.Config{Host: cfg.Host, BearerToken: cfg.Token, TLSClientConfig: rest.TLSClientConfig{CAData: cfg.CAData}, QPS: -1}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	floor, err := client.New(rc, client.Options{})
	if err != nil {
		return nil, nil, err
	}
	// One informer on the floor's CRD, in every namespace, as the manager
	// keeps one on permits: each create and delete is a watch event that
	// kube-apiserver encodes and sends, and this process decodes.
	dc, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	f := dynamicinformer.NewDynamicSharedInformerFactory(dc, 0)
	inf := f.ForResource(schema.GroupVersionResource{Group: floorGroup, Version: "v1alpha1", Resource: "queenlocks"}).Informer()
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	synced, syncCancel := context.WithTimeout(ctx, time.Minute)
	defer syncCancel()
	if !cache.WaitForCacheSync(synced.Done(), inf.HasSynced) {
		cancel()
		return nil, nil, fmt.Errorf("the floor's informer never synced")
	}
	cp := &clientProc{ns: cfg.Namespace, cs: cs, floor: floor}
	u, err := url.Parse(cfg.Route)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	for i := range maxClients {
		// The shipped defaults: no Client, no namespace (the route's
		// default, as make dev's users call it).
		cp.handles = append(cp.handles, handle.HTTP(cfg.Route, handle.HTTPOptions{}))
		cp.plain = append(cp.plain, &plainClient{addr: u.Host, path: u.Path, from: net.IPv4(127, 0, 1, byte(1+i%250))})
	}
	if err := waitRoute(cp.handles[0]); err != nil {
		cancel()
		return nil, nil, err
	}
	return cp, func() {
		cancel()
		f.Shutdown()
		for _, p := range cp.plain {
			p.close()
		}
	}, nil
}

// profiled runs c under a CPU profile of this process when it asks.
func (cp *clientProc) profiled(c clientCommand) clientAnswer {
	if c.Profile == "" {
		return cp.run(c)
	}
	f, err := os.Create(c.Profile)
	if err != nil {
		return clientAnswer{Err: err.Error()}
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		return clientAnswer{Err: err.Error()}
	}
	a := cp.run(c)
	pprof.StopCPUProfile()
	return a
}

// run carries out one command.
func (cp *clientProc) run(c clientCommand) clientAnswer {
	if c.Conc < 1 || c.Conc > maxClients {
		return clientAnswer{Err: fmt.Sprintf("%d clients: from 1 to %d", c.Conc, maxClients)}
	}
	if c.Path == pathHandoff {
		lat, err := handoffs(cp.handles[:1], c.Prefix, c.Limit, c.Waiters, c.Rounds, true)
		return answerOf(result{cycles: len(lat)}, lat, err)
	}
	name := func(w int) string { return fmt.Sprintf("%s-%d", c.Prefix, w) }
	ctx := context.Background()
	var cyc cycle
	switch c.Path {
	case pathLease:
		cyc = func(ctx context.Context, w, _ int) error {
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name(w)}}
			if _, err := cp.cs.CoordinationV1().Leases(cp.ns).Create(ctx, l, metav1.CreateOptions{}); err != nil {
				return err
			}
			return cp.cs.CoordinationV1().Leases(cp.ns).Delete(ctx, l.Name, metav1.DeleteOptions{})
		}
	case pathFloor:
		cyc = func(ctx context.Context, w, _ int) error {
			u := floorObject(cp.ns, name(w), fmt.Sprint("w", w), time.Now())
			if err := cp.floor.Create(ctx, u); err != nil {
				return err
			}
			return cp.floor.Delete(ctx, u)
		}
	case pathHandle:
		cyc = lockCycle(func(w int) cycler { return handleCycler{cp.handles[w]} }, name)
	case pathPlain:
		cyc = lockCycle(func(w int) cycler { return cp.plain[w] }, name)
	case pathLease + renewSuffix:
		return cp.renews(ctx, leases{cp.cs, cp.ns, &sync.Map{}}, c, name)
	case pathFloor + renewSuffix:
		return cp.renews(ctx, floorPermits{cp.floor, cp.ns, &sync.Map{}}, c, name)
	case pathHandle + renewSuffix:
		return cp.renews(ctx, permits{cp.handles[0]}, c, name)
	case pathPlain + renewSuffix:
		return cp.renews(ctx, plainHolding(cp.plain), c, name)
	default:
		return clientAnswer{Err: fmt.Sprintf("no path %q", c.Path)}
	}
	r, lat, err := measure(c.Path, c.Conc, c.For, cyc)
	return answerOf(r, lat, err)
}

func answerOf(r result, lat []time.Duration, err error) clientAnswer {
	a := clientAnswer{Cycles: r.cycles, Secs: r.secs, Lat: lat}
	if err != nil {
		a.Err = err.Error()
	}
	return a
}

// lockCycle acquires the client's own lock and releases it. An acquire
// that finds the lock already held (a release lost before it) or a
// release that fails stops the measurement: each cycle must be the two
// writes it is counted as.
func lockCycle(c func(w int) cycler, name func(w int) string) cycle {
	return func(ctx context.Context, w, _ int) error {
		return c(w).cycle(ctx, name(w))
	}
}

// cycler is a client of the route that can do one acquire+release.
type cycler interface {
	cycle(ctx context.Context, lock string) error
}

// handleCycler is the Go handle's route transport.
type handleCycler struct{ t handle.Transport }

func (h handleCycler) cycle(ctx context.Context, lock string) error {
	a, err := h.t.Acquire(ctx, lock, "r", renewTTL, 1)
	if err != nil {
		return err
	}
	if !a.Acquired || a.Already {
		return fmt.Errorf("acquire of %s: acquired %v, already %v, reason %q", lock, a.Acquired, a.Already, a.Reason)
	}
	ok, err := h.t.Release(ctx, lock, a.Slot, a.Token, "r")
	if err == nil && !ok {
		err = fmt.Errorf("release of %s answered lost", lock)
	}
	return err
}

// renews has each client hold one of h and renew it back to back for the
// command's time, each renew conditional on the token the last answered.
func (cp *clientProc) renews(ctx context.Context, h holding, c clientCommand, name func(int) string) clientAnswer {
	tokens := make([]uint64, c.Conc)
	for w := range c.Conc {
		tok, err := h.acquire(ctx, name(w))
		if err != nil {
			return clientAnswer{Err: fmt.Sprintf("acquire %s: %v", name(w), err)}
		}
		tokens[w] = tok
	}
	r, lat, err := measure(c.Path, c.Conc, c.For, func(ctx context.Context, w, _ int) error {
		tok, why, err := h.renew(ctx, name(w), tokens[w])
		if err == nil && why != "" {
			err = fmt.Errorf("renew of %s lost: %s", name(w), why)
		}
		tokens[w] = tok
		return err
	})
	for w := range c.Conc {
		h.release(ctx, name(w), tokens[w])
	}
	return answerOf(r, lat, err)
}

// plainClient calls the route as a client in any language does that keeps
// its connection alive: one HTTP/1.1 connection, a request written whole,
// the answer read whole, and the connection used again. No pool, no
// HTTP/2, nothing of Go's HTTP client.
//
// Each dials from a loopback address of its own (from), as callers in
// separate pods come from addresses of their own: the route bounds the
// connections of one address (64 by default), and the Go handles' pool,
// which this process shares, may hold as many idle.
type plainClient struct {
	addr, path string
	from       net.IP
	conn       net.Conn
	r          *bufio.Reader
}

func (p *plainClient) close() {
	if p.conn != nil {
		_ = p.conn.Close()
		p.conn = nil
	}
}

// call sends one operation and answers its result. The route closes a
// connection left idle past its idle timeout; a call that finds its kept
// connection closed so (no answer at all) is sent again on a new one, as
// Go's and curl's clients do.
func (p *plainClient) call(op map[string]any) (routeapi.Result, error) {
	body, err := json.Marshal(map[string]any{"operations": []any{op}})
	if err != nil {
		return routeapi.Result{}, err
	}
	reused := p.conn != nil
	res, err := p.send(body)
	if reused && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
		res, err = p.send(body)
	}
	return res, err
}

// send writes one call on the kept connection, dialling one if there is
// none, and reads its answer.
func (p *plainClient) send(body []byte) (routeapi.Result, error) {
	var err error
	if p.conn == nil {
		d := net.Dialer{Timeout: 10 * time.Second}
		if p.from != nil {
			d.LocalAddr = &net.TCPAddr{IP: p.from}
		}
		if p.conn, err = d.Dial("tcp", p.addr); err != nil {
			return routeapi.Result{}, err
		}
		p.r = bufio.NewReader(p.conn)
	}
	var req bytes.Buffer
	fmt.Fprintf(&req, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", p.path, p.addr, len(body))
	req.Write(body)
	_ = p.conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := p.conn.Write(req.Bytes()); err != nil {
		p.close()
		return routeapi.Result{}, err
	}
	resp, err := http.ReadResponse(p.r, nil)
	if err != nil {
		p.close()
		return routeapi.Result{}, err
	}
	data, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || resp.Close {
		p.close()
	}
	if err != nil {
		return routeapi.Result{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return routeapi.Result{}, fmt.Errorf("route answered %d: %.200s", resp.StatusCode, data)
	}
	var out routeapi.Response
	if err := json.Unmarshal(data, &out); err != nil || len(out.Results) != 1 {
		return routeapi.Result{}, fmt.Errorf("the route answered something that is not one result: %.200q", data)
	}
	return out.Results[0], nil
}

func (p *plainClient) acquire(_ context.Context, name string) (uint64, error) {
	r, err := p.call(map[string]any{"op": "acquire", "name": name, "ttlSeconds": renewTTL, "owner": "r"})
	if err != nil {
		return 0, err
	}
	if r.Acquired == nil || !*r.Acquired || r.Already || r.Token == nil {
		return 0, fmt.Errorf("acquire of %s: not acquired afresh: %s", name, r.Reason)
	}
	return *r.Token, nil
}

func (p *plainClient) cycle(ctx context.Context, lock string) error {
	tok, err := p.acquire(ctx, lock)
	if err != nil {
		return err
	}
	return p.releaseOK(lock, tok)
}

func (p *plainClient) releaseOK(name string, token uint64) error {
	r, err := p.call(map[string]any{"op": "release", "name": name, "token": token, "owner": "r"})
	if err == nil && (r.Released == nil || !*r.Released) {
		err = fmt.Errorf("release of %s: %s", name, r.Reason)
	}
	return err
}

func (p *plainClient) renew(_ context.Context, name string, token uint64) (uint64, string, error) {
	r, err := p.call(map[string]any{"op": "renew", "name": name, "token": token, "owner": "r", "ttlSeconds": renewTTL})
	if err != nil {
		return 0, "", err
	}
	if r.Renewed == nil || !*r.Renewed || r.Token == nil {
		return 0, r.Reason, nil
	}
	return *r.Token, "", nil
}

func (p *plainClient) release(_ context.Context, name string, token uint64) {
	_ = p.releaseOK(name, token)
}

// plainHolding gives each lock of a renew measurement its own plain
// client, by the client number at the end of its name: a plain client is
// one connection, used by one caller at a time.
type plainHolding []*plainClient

func (ph plainHolding) of(name string) *plainClient { return ph[clientOf(name)%len(ph)] }

func (ph plainHolding) acquire(ctx context.Context, name string) (uint64, error) {
	return ph.of(name).acquire(ctx, name)
}

func (ph plainHolding) renew(ctx context.Context, name string, token uint64) (uint64, string, error) {
	return ph.of(name).renew(ctx, name, token)
}

func (ph plainHolding) release(ctx context.Context, name string, token uint64) {
	ph.of(name).release(ctx, name, token)
}

// clientOf is the number a name ends in ("r8-3" is 3), 0 when none.
func clientOf(name string) int {
	start := len(name)
	for start > 0 && name[start-1] >= '0' && name[start-1] <= '9' {
		start--
	}
	n := 0
	for _, c := range name[start:] {
		n = n*10 + int(c-'0')
	}
	return n
}

// runClientsMain is main for -client.
func runClientsMain() {
	quietLogs()
	if err := runClients(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench clients:", err)
		os.Exit(1)
	}
}

// quietLogs logs controller-runtime's errors only, as the control plane
// of the other sections sets it up, for a process that starts none.
func quietLogs() {
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
}
