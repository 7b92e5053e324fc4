package main

import (
	"fmt"
	"runtime"
	"strings"
	"time"
)

// row is what one step measured.
type row struct {
	held, namespaces        int
	create, settle, took    time.Duration
	createRate              float64 // pods with their permits per second
	mgrRSS, mgrHeap, apiRSS int64
	watches                 map[string]float64 // kube-apiserver's open watches by resource
	followed, watched       float64
	holderPodErrors         float64
	expiry, podGone, route  lags
	restart                 restart
	load                    string // the machine's load average as the step began
}

func (l lags) String() string {
	if l.n == 0 && l.missed == 0 {
		return "-"
	}
	s := dur(l.p50) + " / " + dur(l.p99)
	if l.missed > 0 {
		s += fmt.Sprintf(" (%d of %d not seen)", l.missed, l.n+l.missed)
	}
	return s
}

// dur writes a duration in milliseconds under ten seconds, else in seconds.
func dur(d time.Duration) string {
	if d > -10*time.Second && d < 10*time.Second {
		return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000)
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// restartCell writes a restart time; "n/a" when its probe did not apply.
func restartCell(d time.Duration) string {
	if d == 0 {
		return "n/a"
	}
	return dur(d)
}

func (r row) summary() string {
	var b strings.Builder
	fmt.Fprintln(&b, tableHead)
	fmt.Fprint(&b, r.tableRow())
	return b.String()
}

const tableHead = "| held permits | namespaces | create | settle | manager RSS | manager heap in use | kube-apiserver RSS | watches: pods | watches: queenlocks | watches: all | followed pods | namespaces watched | expiry lag p50 / p99 | pod-gone lag p50 / p99 | route acquire p50 / p99 | restart: stop | restart: ready | restart: leader | restart: expiry works | restart: pod-gone works | restart: all pods followed | restart: all pod watches | step took |\n" +
	"|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"

func (r row) tableRow() string {
	var all float64
	for _, v := range r.watches {
		all += v
	}
	rs := r.restart
	return fmt.Sprintf("| %d | %d | %s (%.0f/s) | %s | %s | %s | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
		r.held, r.namespaces, dur(r.create), r.createRate, dur(r.settle), mib(r.mgrRSS), mib(r.mgrHeap), mib(r.apiRSS),
		r.watches["pods"], r.watches["queenlocks"], all, r.followed, r.watched,
		r.expiry, r.podGone, r.route,
		dur(rs.stop), restartCell(rs.ready), restartCell(rs.leader), restartCell(rs.expired), restartCell(rs.podGone),
		restartCell(rs.followed), restartCell(rs.watches), dur(r.took))
}

// report is the run's markdown.
type report struct {
	cfg                   config
	started, finished     time.Time
	loadBefore, loadAfter string
	memTotal              int64
	apiVersion            string
	rows                  []row
	stopped               string // why the run stopped before its last step
}

func (rep *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Scale benchmarks\n\n"+
		"Reproduce with `make bench-scale`. Numbers are from one run on a shared, noisy machine; they are measurements, not targets.\n\n")
	fmt.Fprintf(&b, "Measured %s on this machine: %d cores, %s memory, kube-apiserver %s (etcd and kube-apiserver built by the project, through envtest), %s. "+
		"The run took %s. Load average (1, 5, 15 min): %s at the start, %s at the end.\n\n",
		rep.started.UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), gib(rep.memTotal), rep.apiVersion, runtime.Version(),
		dur(rep.finished.Sub(rep.started)), rep.loadBefore, rep.loadAfter)
	fmt.Fprintf(&b, "Flags: `%s`.\n\n", rep.cfg.flagLine())
	fmt.Fprintf(&b, "Each step holds the given number of permits, each by a pod of its own, spread evenly over the namespaces (the namespaces column is how many hold permits); "+
		"the steps grow one from the other without deleting. One manager replica runs as a process of its own, as its ServiceAccount, with `--leader-elect` and `--expiry-grace %s`.\n\n", rep.cfg.grace)
	fmt.Fprintln(&b, tableHead)
	for _, r := range rep.rows {
		b.WriteString(r.tableRow())
	}
	if rep.stopped != "" {
		fmt.Fprintf(&b, "\n%s\n", rep.stopped)
	}
	var notes []string
	for _, r := range rep.rows {
		if r.restart.note != "" {
			notes = append(notes, fmt.Sprintf("At %d held permits, %s.", r.held, r.restart.note))
		}
		if r.holderPodErrors > 0 {
			notes = append(notes, fmt.Sprintf("At %d held permits, the manager counted %.0f failed lists or watches of holder pods (`queen_locks_holder_pod_errors_total`) by the time the step settled.", r.held, r.holderPodErrors))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintf(&b, "\n%s\n", strings.Join(notes, "\n\n"))
	}
	fmt.Fprintf(&b, "\nLoad average (1 min) as each step began: %s.\n", rep.loads())
	b.WriteString(rep.notes())
	return b.String()
}

func (rep *report) loads() string {
	var l []string
	for _, r := range rep.rows {
		one, _, _ := strings.Cut(r.load, ",")
		l = append(l, fmt.Sprintf("%s at %d", one, r.held))
	}
	if len(l) == 0 {
		return "no step finished"
	}
	return strings.Join(l, "; ")
}

func gib(b int64) string {
	if b <= 0 {
		return "unknown"
	}
	return fmt.Sprintf("%.0f GiB", float64(b)/(1<<30))
}

func (rep *report) notes() string {
	c := rep.cfg
	return fmt.Sprintf(`
## How each number is measured

- **create**: the time to create the step's new pods and their permits, %d at a time, and the rate. Each pod is a Pod object only (no kubelet runs it; it stays Pending), of a ServiceAccount made in its namespace for the purpose. Its permit is taken by the benchmark as the admin through the locks library (`+"`locks.Acquire`"+` with `+"`locks.HolderPod`"+`), with a TTL of %d s, never renewed and longer than the run, so renews are no part of the load.
- **settle**: from the end of the creates until the manager reports itself leader, its `+"`queen_locks_holder_pods_followed`"+` and `+"`queen_locks_holder_pods_named`"+` gauges reach the held count, its `+"`queen_locks_holder_pod_namespaces_watched`"+` gauge the namespaces that hold permits, and kube-apiserver counts at least as many open watches of pods beyond the manager's own (its cache's watch of gated pods, counted once it leads, before any holder pod); polled every 200 ms. The figures after it are read 2 s later.
- **manager RSS**: VmRSS of the manager's process in /proc. **manager heap in use**: its `+"`go_memstats_heap_inuse_bytes`"+`, scraped from its own metrics (served with `+"`--metrics-insecure`"+` on a loopback port for this run). The manager is the one restarted at the end of the previous step, grown since.
- **kube-apiserver RSS**: VmRSS of this run's kube-apiserver (found by its certificate directory, as test/bench does).
- **watches**: kube-apiserver's `+"`apiserver_longrunning_requests{verb=\"WATCH\"}`"+` summed by resource (over groups and scopes); all is every resource's. The leader keeps one watch of pod metadata per namespace where a holder pod lives (**namespaces watched**, its `+"`queen_locks_holder_pod_namespaces_watched`"+` gauge), however many pods are held there; the queenlocks watches are the manager's informer and the benchmark's own watch of permits (one, cluster-wide, which times the deletes below).
- **followed pods**: the manager's `+"`queen_locks_holder_pods_followed`"+` gauge (controllers/metrics.go): the pods the leader follows. It counts a pod from the moment a permit names it, before its first list has answered.
- **expiry lag**: %d extra permits, no holder pod, TTL %d s, spread over the namespaces that hold permits, created %d at a time. For each, the lag is from its `+"`expireTime`"+` (as the webhook stamped it) plus the manager's grace (%s), the first moment the controller may delete it, to the moment the benchmark's watch receives its delete.
- **pod-gone lag**: the pods of %d held permits, evenly spread over the fleet, are deleted one after another (a pod no node runs goes at once); for each, the lag is from the return of its pod's delete to the moment the watch receives its permit's delete. Then the pods are made again under the same names (new UIDs) and their permits taken again, so the held count stays at the step.
- **route acquire**: %d acquires of fresh lock names through the manager's route (`+"`POST /api/v1/locks`"+`, `+"`--auth none`"+`, the handle's HTTP transport), one after another, each in a namespace that holds permits, by a fresh caller (a new HTTP client, so the first also opens the connection); each is released after it, untimed.
- **restart**: a permit with a 3 s TTL and a pod holding a permit are made; the manager gets SIGTERM (**stop**: until it exits; it releases its leader Lease as it stops); the pod is deleted while it is down, and the benchmark waits until the 3 s permit is overdue. Then the manager starts again, and each time is from the start of the new process: **ready**, its `+"`/readyz`"+` answers 200; **leader**, its `+"`leader_election_master_status`"+` for the expiry Lease is 1; **expiry works**, the watch receives the overdue permit's delete; **pod-gone works**, the watch receives the delete of the permit whose pod went while it was down; **all pods followed**, its followed gauge is back to the held count; **all pod watches**, kube-apiserver counts a pod watch again for each namespace that holds permits, beyond the manager's own. The readiness and metrics are polled every 100 ms, kube-apiserver's watches every 500 ms; n/a means the probe did not apply (see the notes under the table).
- **step took**: the whole step, creates to the manager's return.
- A step runs only while the machine has %d MiB available, and must finish within %s; the run stops at the first that cannot, and says why under the table.
`+followingNotes, c.workers, c.ttl, c.sample, c.expiryTTL, c.workers, c.grace, c.sample, c.sample, c.minFree>>20, c.stepTimeout)
}

// followingNotes is what the ways the leader has followed holder pods cost,
// measured on 2026-12-04 (the figures are from those runs, not this one).
const followingNotes = `
## What following holder pods costs, by design

The leader must learn when a holder pod is deleted, replaced or finished.
Three designs were measured, at 10,000 pod-held permits over 1,000
namespaces unless said otherwise:

| design | kube-apiserver pod watches | manager RSS | manager heap in use | at 20,000 held |
|---|---:|---:|---:|---|
| a watch per pod (until 2026-12-04) | one per followed pod: 10,000 | about 400 MiB more than with no pods (41 KiB per pod, measured at 1,000 pods over 50 namespaces) | | not run |
| a shared metadata informer per namespace, gzip on, every namespace listed at once | 1,000 | 313 MiB | 187 MiB | a restarted leader lost its Lease: its 1,000 lists queued in kube-apiserver ahead of the Lease renewal past the 10 s renew deadline, and it exited |
| a plain metadata informer per namespace, no gzip, 16 namespaces listed at once (now) | 1,000 | 200 MiB | 101 MiB | 264 MiB RSS; the restart returns, all pod watches open again within 17 s |

A heap profile of 400 followed namespaces showed where the middle design
spent its 64 KiB of heap per namespace: 46 KiB was the gzip reader each
open watch keeps (its 32 KiB window and buffers), and most of the rest the
shared informer's fan-out (a buffer of 1,024 notifications and its
goroutines). Without both, a namespace costs about 21 KiB of heap and
30 KiB of goroutine stacks (six goroutines). So the leader's memory grows
with the namespaces that hold pod-held locks (about 50 KiB each) and with
the permits (the informer's cache, about 2 KiB each), not with a watch per
pod. kube-apiserver's watches from the leader are one per such namespace,
whatever the held count.
`
