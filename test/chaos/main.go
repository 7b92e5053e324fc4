// Command chaos is make chaos: the fault-injection safety check. It starts a
// local control plane and manager replicas as separate processes, runs
// client processes that contend for a lock and a semaphore and write a
// guarded ConfigMap (and some that misbehave, and some that queue gated pods
// for both: see gated.go), kills, pauses, skews and cuts things apart for
// -duration, then checks the recorded history and prints what it found. It
// exits 1 on any violation.
//
//	chaos -duration 1m -manager bin/manager-chaos   # go build -tags chaos -o bin/manager-chaos ./cmd/manager
//
// "chaos client ..." is one client; the harness starts those itself.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/internal/route"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "client" {
		if err := runClient(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "chaos client:", err)
			os.Exit(2)
		}
		return
	}
	os.Exit(run())
}

func run() int {
	duration := flag.Duration("duration", time.Minute, "How long faults are injected; the run takes longer (start, final settle, check).")
	clients := flag.Int("clients", 4, "Client processes contending for the lock.")
	ttl := flag.Int64("ttl", 2, "Lease lifetime the clients ask for, in seconds.")
	grace := flag.Duration("grace", time.Second, "The manager's --expiry-grace; the checks allow exactly this.")
	gapMin := flag.Duration("gap-min", time.Second, "Shortest pause between two faults.")
	gapMax := flag.Duration("gap-max", 3*time.Second, "Longest pause between two faults.")
	replicas := flag.Int("replicas", 2, "Manager replicas, each serving the webhooks and the route; one leads the expiry controller.")
	skew := flag.Duration("skew", 400*time.Millisecond, "Largest offset of a replica's clock, ahead or behind; the grace must be at least twice it.")
	semaphores := flag.Int("semaphore-clients", 5, fmt.Sprintf("Client processes contending for the semaphore %s (limit %d).", Semaphore, SemaphoreLimit))
	leaders := flag.Int("leaders", 2, fmt.Sprintf("Fenced leader candidates (package election) that write the ConfigMap %s while they lead %s.", LeaderObject, LeaderLock))
	gated := flag.Int("gated-clients", 2, fmt.Sprintf("Client processes that create gated pods (locks.queen.dev/gate) for %s and %s, and end them once let in; 0 runs none, and the manager without --gated-pods.", Lock, Semaphore))
	drop := flag.Float64("drop-answers", 0.05, "Share of the holders' route calls whose answer is dropped after a replica carried the call out; the retry reaches the other replica.")
	auth := flag.String("auth", route.AuthToken, "The route's --auth: token (clients send a ServiceAccount token of audience queen-locks) or none.")
	managerArgs := flag.String("manager-args", "", "More flags for every replica, space-separated (a deliberate bug's, with a manager built with -tags chaosbug).")
	seed := flag.Uint64("seed", 0, "Seed of the random choices; 0 picks one (printed, to repeat a run).")
	managerBin := flag.String("manager", "bin/manager-chaos", "The manager binary, built with -tags chaos (make chaos does): only that build takes the clock offset the replicas are skewed with.")
	dir := flag.String("dir", "", "Directory for logs, kubeconfig and history.json (default: a new temporary one, removed when the run passes).")
	faults := flag.String("faults", strings.Join(Faults, ","), "Faults to inject in turn, comma-separated.")
	recheck := flag.String("check", "", "Check the history.json of an earlier run again, and run nothing.")
	roles := flag.String("misbehave", strings.Join(Roles, ","), "Misbehaving clients to run besides the holders, one process each, comma-separated; empty runs none.")
	flag.Parse()

	if *recheck != "" {
		return checkAgain(*recheck)
	}

	if *seed == 0 {
		*seed = rand.Uint64()
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var kinds []string
	for _, f := range strings.Split(*faults, ",") {
		if f = strings.TrimSpace(f); f != "" {
			if !slices.Contains(Faults, f) {
				fmt.Fprintf(os.Stderr, "chaos: unknown fault %q; the faults are %s\n", f, strings.Join(Faults, ", "))
				return 2
			}
			kinds = append(kinds, f)
		}
	}
	var misbehave []string
	for _, r := range strings.Split(*roles, ",") {
		if r = strings.TrimSpace(r); r != "" {
			if !slices.Contains(Roles, r) {
				fmt.Fprintf(os.Stderr, "chaos: unknown role %q; the misbehaving roles are %s\n", r, strings.Join(Roles, ", "))
				return 2
			}
			misbehave = append(misbehave, r)
		}
	}
	for i := 0; i < *semaphores; i++ {
		misbehave = append(misbehave, RoleSemaphore)
	}
	for i := 0; i < *gated; i++ {
		misbehave = append(misbehave, RoleGated)
	}
	for i := 0; i < *leaders; i++ {
		misbehave = append(misbehave, RoleLeader)
	}
	if *auth != route.AuthToken && *auth != route.AuthNone {
		fmt.Fprintf(os.Stderr, "chaos: -auth %q: want %s or %s\n", *auth, route.AuthToken, route.AuthNone)
		return 2
	}
	if *gapMin < 0 || *gapMax < *gapMin {
		fmt.Fprintln(os.Stderr, "chaos: -gap-min must be at least 0 and -gap-max at least -gap-min")
		return 2
	}
	if *replicas < 1 || *skew < 0 || 2**skew > *grace {
		fmt.Fprintln(os.Stderr, "chaos: -replicas must be at least 1, and -skew from 0 to half the -grace: a larger skew than the grace covers is not a promise")
		return 2
	}
	if *clients < 1 || *ttl < 1 || len(kinds) == 0 || *duration <= 0 {
		fmt.Fprintln(os.Stderr, "chaos: -clients and -ttl must be at least 1, -duration above 0, and -faults name one fault or more")
		return 2
	}
	made := *dir == ""
	if made {
		d, err := os.MkdirTemp("", "queen-locks-chaos-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		*dir = d
	} else if err := os.MkdirAll(*dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	start := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%6.1fs %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	logf("seed %d, %d clients, ttl %ds, faults for %s; logs in %s", *seed, *clients, *ttl, *duration, *dir)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := Run(ctx, Config{Duration: *duration, Clients: *clients, TTL: *ttl, Grace: *grace, Replicas: *replicas, Skew: *skew,
		ManagerArgs: strings.Fields(*managerArgs), Auth: *auth, DropAnswers: *drop, Gap: [2]time.Duration{*gapMin, *gapMax}, Seed: *seed,
		Manager: *managerBin, Self: self, Dir: *dir, Faults: kinds, Roles: misbehave, Logf: logf})
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\nevery process's log is in %s\n", err, *dir)
		return 2
	}
	printReport(os.Stdout, res, time.Since(start))
	if len(res.Report.Violations) > 0 || noGiveBack(res.Report, *duration) {
		fmt.Fprintf(os.Stderr, "the history and every process's log are in %s\n", *dir)
		return 1
	}
	if made {
		// A passing run's logs are of no further use; a failing run's are
		// kept, as is a directory the caller named.
		_ = os.RemoveAll(*dir)
	}
	return 0
}

// checkAgain runs the checks over a saved history.
func checkAgain(path string) int {
	raw, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	var h History
	if err := json.Unmarshal(raw, &h); err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %s: %v\n", path, err)
		return 2
	}
	start := time.Now()
	res := &Result{History: h, Report: Check(h, CheckTimeout)}
	printReport(os.Stdout, res, time.Since(start))
	if len(res.Report.Violations) > 0 {
		return 1
	}
	return 0
}

// printReport writes the figures of a run as markdown.
func printReport(w io.Writer, res *Result, took time.Duration) {
	r := res.Report
	fmt.Fprintf(w, "\n| figure | count |\n| --- | ---: |\n")
	row := func(name string, n int) { fmt.Fprintf(w, "| %s | %d |\n", name, n) }
	total := 0
	for _, n := range r.Ops {
		total += n
	}
	row("client operations", total)
	keys := make([]string, 0, len(r.Ops))
	for k := range r.Ops {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		row("  "+k, r.Ops[k])
	}
	row("permit versions recorded", r.Permits)
	row("ConfigMap versions recorded", r.Objects)
	row("guarded writes stored", r.Accepted)
	row("records raised by an acquire's fence", r.Raises)
	row("  of them stored after the permit moved on, before the next acquire was answered", r.Window)
	row("creates of a replaced holder stored after the next acquire was answered (the bound of docs/fencing.md)", r.LateCreates)
	row("deletes of the guarded object (under a current mark)", r.Deletes)
	keys = keys[:0]
	for k := range r.Misbehaving {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		row("misbehaving "+k, r.Misbehaving[k])
	}
	row("calls the route refused with 401 or 403 (token and rights good)", r.Denied)
	row("acquires refused past TTL + grace only while kube-apiserver, etcd or a webhook was down (excused)", r.Excused)
	row("acquires answered held with waiters in the line (the lock left to the line; not checked for availability)", r.LeftToLine)
	fmt.Fprintf(w, "| longest such wait | %s |\n", time.Duration(r.LongestExcused).Round(time.Millisecond))
	fmt.Fprintf(w, "| outages (kube-apiserver or etcd down, a webhook cut off) | %d |\n", len(res.History.Outages))
	row("acquires that waited (waitSeconds)", r.Waiting)
	row("  of them acquired after waiting", r.WaitWon)
	row("semaphore permit versions recorded", r.SemVersions)
	row("most semaphore holders at once (limit 3)", r.MostHolders)
	printGated(row, r.Gated)
	printLeaders(row, r.Leaders)
	printLine(row, func(name string, ns int64) {
		fmt.Fprintf(w, "| %s | %s |\n", name, time.Duration(ns).Round(time.Millisecond))
	}, r.Line)
	row("renewals", r.Renewals)
	for _, k := range []string{"release", "expiry", "takeover", "pod-gone", "gated pod ended"} {
		row("handovers by "+k, r.Handovers[k])
	}
	row("  of them after a foreground or orphan delete", r.Handovers["deleting"])
	fmt.Fprintf(w, "| longest wait from a lease's end to the next acquire, clients refused meanwhile | %s |\n", time.Duration(r.LongestWait).Round(time.Millisecond))
	for _, f := range append(Faults, "manager exited by itself", FaultDroppedAnswer, FaultHeld, FaultHungUp) {
		row("fault: "+f, res.Faults[f])
	}
	row("lost answers settled from the record", r.Resolved)
	row("  acquires the route may have given back, their caller gone", r.GaveBack)
	row("acquires sent without an owner, hung up before the answer", r.GiveBack.HungUp)
	row("  leases they won (owners the route minted)", r.GiveBack.Won)
	row("  given back by the route (deleted before they could expire)", r.GiveBack.Back)
	row("  deleted only once they may have expired", r.GiveBack.RanOut)
	row("  not deleted by the end of the record", r.GiveBack.Pending)
	row("lost answers that left no trace (not applied)", r.Dropped)
	row("lost answers left open", r.Open)
	row("violations", len(r.Violations))
	fmt.Fprintf(w, "\nlinearizable: %s; run took %s\n", r.Linearized, took.Round(time.Second))
	for _, v := range r.Violations {
		fmt.Fprintln(w, "VIOLATION:", v)
	}
	if r.GiveBack.Back == 0 {
		fmt.Fprintln(w, "\n*** NO GIVE-BACK RAN IN THIS RUN: the route's give-back of an acquire whose caller hung up went unchecked ***")
	}
}

// noGiveBack tells whether a run gave nothing back and must fail for it:
// in CI (CI=true), a run of at least giveBackRun. A hung-up acquire wins
// (and is given back) only when a semaphore slot is free as it lands, a
// few times in five minutes; the one-minute run of make test often has
// none, and says so without failing.
func noGiveBack(r Report, d time.Duration) bool {
	return r.GiveBack.Back == 0 && os.Getenv("CI") == "true" && d >= giveBackRun
}

// giveBackRun is the shortest run that must give something back in CI.
const giveBackRun = 5 * time.Minute

// runClient is one client process: it runs until its stdin closes, writing
// each operation as a JSON line on stdout.
func runClient(args []string) error {
	fs := flag.NewFlagSet("chaos client", flag.ContinueOnError)
	c := &Client{}
	fs.IntVar(&c.ID, "id", 0, "This client's number.")
	routeURL := fs.String("route", "", "URL of the lock route.")
	fs.StringVar(&c.Namespace, "namespace", Namespace, "Namespace of the lock and the ConfigMap.")
	fs.StringVar(&c.Lock, "lock", Lock, "The lock.")
	fs.StringVar(&c.Object, "object", Object, "The guarded ConfigMap.")
	fs.Int64Var(&c.TTL, "ttl", 2, "Lease lifetime in seconds.")
	seed := fs.Uint64("seed", 1, "Seed of the client's random pauses.")
	kubeconfig := fs.String("kubeconfig", "", "Kubeconfig of the API server.")
	tokenFile := fs.String("token-file", "", "File holding the ServiceAccount token to send to the route; empty sends none (--auth=none).")
	user := fs.String("user", "", "User to act as on the API server (impersonated); empty acts as the kubeconfig's.")
	fs.StringVar(&c.Role, "role", RoleHolder, "What the client does: "+strings.Join(append([]string{RoleHolder}, Roles...), ", ")+".")
	fs.StringVar(&c.OtherLock, "other-lock", OtherLock, "The second lock of the other-lock role.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := ClientREST(*kubeconfig, *user)
	if err != nil {
		return err
	}
	c.REST = cfg
	if c.Kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	if c.Permits, err = ctrlclient.New(cfg, ctrlclient.Options{Scheme: manager.Scheme}); err != nil {
		return err
	}
	c.Route = RouteTransport(*routeURL, c.Namespace, *tokenFile)
	c.Rand = rand.New(rand.NewPCG(*seed, *seed))
	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	c.Log = func(op Op) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(op)
	}
	c.LogHold = func(h Hold) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(holdLine{Hold: &h})
	}
	c.LogPod = func(p PodInfo) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(podLine{Pod: &p})
	}
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	c.Run(context.Background(), stop)
	return nil
}
