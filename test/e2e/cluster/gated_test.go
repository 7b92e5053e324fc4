package cluster_test

import (
	"bufio"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/queen-locks/queen-locks/test/e2e/cluster"
	"github.com/queen-locks/queen-locks/test/e2e/oci"
)

// Gated pods (docs/gated-pods.md) on the node: the chart is installed with
// gatedPods.enabled=true (TestInstall).
const (
	gatedNS      = "reports" // examples/cronjob-gated's
	semaphoreNS  = "render"  // examples/deployment-semaphore's
	plainImage   = "queen-locks.test/e2e/plain-report:1"
	gateLabel    = "locks.queen.dev/gate"
	gateName     = "locks.queen.dev/lock" // the scheduling gate, and the annotation naming the lock
	tokenAnn     = "locks.queen.dev/token"
	slotAnn      = "locks.queen.dev/slot"
	queuedAtAnn  = "locks.queen.dev/queued-at"
	admittedAnn  = "locks.queen.dev/admitted-at"
	gateTimes    = "2006-01-02T15:04:05.000000Z" // of queued-at and admitted-at
	queenlockCmd = "github.com/queen-locks/queen-locks/cmd/queenlock"
)

// imageFiles unpacks an OCI archive's image and answers its files, and the
// ones that are queenlock: by name, or a Go binary built from
// cmd/queenlock whatever its name (its build information says so even
// stripped).
func imageFiles(t *testing.T, archive string) (img *oci.Image, files, queenlocks []string) {
	t.Helper()
	img, err := oci.Read(archive)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := img.Unpack(dir); err != nil {
		t.Fatalf("unpacking %s: %v", archive, err)
	}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name := "/" + filepath.ToSlash(strings.TrimPrefix(p, dir+string(filepath.Separator)))
		files = append(files, name)
		bi, berr := buildinfo.ReadFile(p)
		if strings.Contains(strings.ToLower(d.Name()), "queenlock") || (berr == nil && bi.Path == queenlockCmd) {
			queenlocks = append(queenlocks, name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return img, files, queenlocks
}

// plainReportImage builds an image holding test/e2e/report alone with the
// project's image tool (what make e2e-images built it with), checks that
// it holds no queenlock, and imports it into the node.
func plainReportImage(t *testing.T, ctx context.Context) {
	t.Helper()
	archive := filepath.Join(t.TempDir(), "plain-report.tar")
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "image-tool"), "-out", archive, "-name", plainImage,
		"-entrypoint", "/report", "-file", "/report="+filepath.Join(bin, "e2e", "report"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", plainImage, err, out)
	}
	// The check sees queenlock where it is: in the report image that
	// TestCronJob runs examples/cronjob with.
	if _, _, found := imageFiles(t, filepath.Join(bin, "e2e", "report.tar")); len(found) == 0 {
		t.Fatalf("the report image of TestCronJob holds no queenlock that this check can see")
	}
	img, files, found := imageFiles(t, archive)
	if len(found) > 0 {
		t.Fatalf("%s holds queenlock: %q (all its files: %q)", plainImage, found, files)
	}
	hasReport := false
	for _, f := range files {
		hasReport = hasReport || f == "/report"
	}
	if ep := img.Config.Config.Entrypoint; !hasReport || len(ep) != 1 || ep[0] != "/report" || img.Name != plainImage {
		t.Fatalf("%s: name %q, entrypoint %q, files %q; want /report as its entrypoint", plainImage, img.Name, ep, files)
	}
	t.Logf("%s: %s, user %s", plainImage, strings.Join(files, " "), img.Config.Config.User)
	// The node's containerd, at the socket cluster.Start gave it.
	sock := filepath.Join(c.Dir, "containerd", "containerd.sock")
	if out, err := exec.CommandContext(ctx, "ctr", "--address", sock, "-n", "k8s.io", "images", "import", archive).CombinedOutput(); err != nil {
		t.Fatalf("importing %s: %v\n%s", plainImage, err, out)
	}
}

func createNamespace(t *testing.T, ctx context.Context, ns string) {
	t.Helper()
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// gated says whether a pod still waits at the gate.
func gated(p *corev1.Pod) bool {
	for _, g := range p.Spec.SchedulingGates {
		if g.Name == gateName {
			return true
		}
	}
	return false
}

func finished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// gateTime reads queued-at or admitted-at.
func gateTime(t *testing.T, p *corev1.Pod, key string) time.Time {
	t.Helper()
	at, err := time.Parse(gateTimes, p.Annotations[key])
	if err != nil {
		t.Errorf("%s: annotation %s: %v", p.Name, key, err)
	}
	return at
}

// holding are the pods let in (the gate lifted) that have not finished:
// the ones holding a slot of the lock.
func holding(pods []corev1.Pod) []*corev1.Pod {
	var h []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		if !gated(p) && p.Annotations[tokenAnn] != "" && !finished(p) {
			h = append(h, p)
		}
	}
	return h
}

// permitsOf are the QueenLocks of a lock in a namespace.
func permitsOf(t *testing.T, ctx context.Context, ns, lock string) []string {
	t.Helper()
	l, err := dynamic.NewForConfigOrDie(c.Rest).Resource(queenlocks).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, item := range l.Items {
		if l, _, _ := unstructured.NestedString(item.Object, "spec", "lock"); l == lock {
			names = append(names, item.GetName())
		}
	}
	return names
}

// TestGatedCronJobs: examples/cronjob-gated as two CronJobs that share one
// lock, every minute, each with a job longer than a minute and
// concurrencyPolicy Forbid as the example has it. Forbid keeps each
// CronJob from overlapping itself; only the lock keeps the two apart. The
// image holds the report alone: no queenlock, no wrapper. From the pods'
// own output and their containers' times: no two runs at once, tokens that
// grow, the runs in the order their pods were queued.
func TestGatedCronJobs(t *testing.T) {
	needInstall(t)
	ctx := context.Background()
	const ns = gatedNS
	plainReportImage(t, ctx)
	createNamespace(t, ctx, ns)
	dir := filepath.Join(root, "examples", "cronjob-gated")
	if _, err := c.Kubectl(ctx, bin, "apply", "-f", filepath.Join(dir, "rbac.yaml")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "cronjob.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var example batchv1.CronJob
	if err := yaml.UnmarshalStrict(b, &example); err != nil {
		t.Fatal(err)
	}
	if example.Namespace != ns {
		t.Fatalf("the example's namespace is %q, want %q", example.Namespace, ns)
	}
	tmpl := example.Spec.JobTemplate.Spec.Template
	lock := tmpl.Annotations[gateName]
	if tmpl.Labels[gateLabel] != "true" || lock == "" || example.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
		t.Fatalf("examples/cronjob-gated/cronjob.yaml: label %q, lock %q, concurrencyPolicy %q; want a gated pod template and Forbid",
			tmpl.Labels[gateLabel], lock, example.Spec.ConcurrencyPolicy)
	}
	// The report reads QUEEN_LOCK_TOKEN: the example must fill it from
	// the token annotation.
	fromToken := false
	for _, e := range tmpl.Spec.Containers[0].Env {
		fromToken = fromToken || (e.Name == "QUEEN_LOCK_TOKEN" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil &&
			e.ValueFrom.FieldRef.FieldPath == "metadata.annotations['"+tokenAnn+"']")
	}
	if !fromToken {
		t.Fatalf("examples/cronjob-gated/cronjob.yaml: no QUEEN_LOCK_TOKEN from the downward API's %s", tokenAnn)
	}

	// What the test changes in the example, and why: every minute, so
	// schedules pass in a few minutes; the plain image with a report of
	// 65 s, longer than a schedule's minute; every Job kept, to read every
	// pod's output. Forbid stays. The second CronJob is the README's
	// month-end copy: another name, the same lock.
	const reportFor = 65 * time.Second
	var names []string
	for _, name := range []string{example.Name, "month-end-report"} {
		cj := example.DeepCopy()
		cj.Name = name
		cj.Spec.Schedule = "* * * * *"
		cj.Spec.SuccessfulJobsHistoryLimit = ptr.To[int32](20)
		cj.Spec.FailedJobsHistoryLimit = ptr.To[int32](20)
		ctr := &cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0]
		ctr.Image, ctr.ImagePullPolicy = plainImage, corev1.PullNever
		ctr.Command = []string{"/report", "--for=" + reportFor.String()}
		if _, err := c.Client.BatchV1().CronJobs(ns).Create(ctx, cj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	t.Logf("CronJobs %q every minute on lock %q, Forbid, %s runs", names, lock, reportFor)
	cronJobOf := func(p *corev1.Pod) string {
		job := p.Labels["batch.kubernetes.io/job-name"]
		for _, n := range names {
			if strings.HasPrefix(job, n+"-") {
				return n
			}
		}
		return ""
	}

	// Until three runs have finished: at every look, at most one pod is let
	// in and not finished, and no pod runs that was not let in.
	done := map[string]*corev1.Pod{}
	most := 0
	await(t, "three gated runs have finished", 8*time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		h := holding(pods.Items)
		most = max(most, len(h))
		if len(h) > 1 {
			return false, fmt.Errorf("%d pods hold lock %q at once: %s and %s", len(h), lock, h[0].Name, h[1].Name)
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if gated(p) && (p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending) {
				return false, fmt.Errorf("%s is still gated but %s on node %q", p.Name, p.Status.Phase, p.Spec.NodeName)
			}
			if _, seen := done[p.Name]; seen || !finished(p) {
				continue
			}
			done[p.Name] = p.DeepCopy()
			if p.Status.Phase == corev1.PodFailed {
				return false, fmt.Errorf("%s failed; its output:\n%s", p.Name, logs(t, ctx, ns, p.Name))
			}
		}
		return len(done) >= 3, nil
	})

	type run struct {
		pod, cronJob            string
		token                   uint64
		queued, admitted        time.Time // the manager's (to the microsecond)
		started, ended          time.Time // the report's own output
		ctrStarted, ctrFinished time.Time // the container's, as the kubelet reports it (whole seconds)
		waitingEvents           string
	}
	evs, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var runs []run
	for _, p := range done {
		out := logs(t, ctx, ns, p.Name)
		t.Logf("%s (%s) %s: %s", p.Name, cronJobOf(p), p.Status.Phase, strings.TrimSpace(out))
		var lines []reportLine
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			var l reportLine
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Event != "" {
				lines = append(lines, l)
			}
		}
		if len(lines) != 2 || lines[0].Event != "start" || lines[1].Event != "end" {
			t.Errorf("%s: the report printed %+v, want a start and an end", p.Name, lines)
			continue
		}
		// The token the report read through the downward API is the one
		// the manager wrote on the pod.
		if lines[0].Token != p.Annotations[tokenAnn] || lines[1].Token != lines[0].Token {
			t.Errorf("%s: the report read QUEEN_LOCK_TOKEN %q, the pod's annotation %s is %q", p.Name, lines[0].Token, tokenAnn, p.Annotations[tokenAnn])
		}
		tok, err := strconv.ParseUint(lines[0].Token, 10, 64)
		if err != nil || tok == 0 {
			t.Errorf("%s: QUEEN_LOCK_TOKEN %q is not a token: %v", p.Name, lines[0].Token, err)
		}
		if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Terminated == nil || p.Status.ContainerStatuses[0].State.Terminated.ExitCode != 0 {
			t.Errorf("%s: container statuses %+v, want one that exited 0", p.Name, p.Status.ContainerStatuses)
			continue
		}
		term := p.Status.ContainerStatuses[0].State.Terminated
		r := run{pod: p.Name, cronJob: cronJobOf(p), token: tok,
			queued: gateTime(t, p, queuedAtAnn), admitted: gateTime(t, p, admittedAnn),
			started: lines[0].At, ended: lines[1].At,
			ctrStarted: term.StartedAt.Time, ctrFinished: term.FinishedAt.Time}
		for _, e := range evs.Items {
			if e.InvolvedObject.UID == p.UID && e.Reason == "Waiting" {
				r.waitingEvents += e.Message + "; "
			}
		}
		runs = append(runs, r)
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].started.Before(runs[j].started) })
	cronJobs := map[string]bool{}
	for i, r := range runs {
		cronJobs[r.cronJob] = true
		t.Logf("run %d: %s (%s) token %d; queued %s, let in %s, container %s to %s, report %s to %s; waited: %s", i, r.pod, r.cronJob, r.token,
			r.queued.Format(time.RFC3339Nano), r.admitted.Format(time.RFC3339Nano), r.ctrStarted.Format(time.RFC3339), r.ctrFinished.Format(time.RFC3339),
			r.started.Format(time.RFC3339Nano), r.ended.Format(time.RFC3339Nano), r.waitingEvents)
		// The container starts only after its gate is lifted.
		if r.started.Before(r.admitted) {
			t.Errorf("%s printed its start at %s, before its gate was lifted at %s", r.pod, r.started.Format(time.RFC3339Nano), r.admitted.Format(time.RFC3339Nano))
		} else {
			t.Logf("%s: from the gate lifted to the report's first line: %s", r.pod, r.started.Sub(r.admitted).Round(time.Millisecond))
		}
		if i == 0 {
			continue
		}
		a := runs[i-1]
		if r.started.Before(a.ended) || r.ctrStarted.Before(a.ctrFinished) || r.admitted.Before(a.ctrFinished) {
			t.Errorf("two runs at once: %s ran %s to %s (container until %s), %s was let in at %s and started at %s (container %s)",
				a.pod, a.started.Format(time.RFC3339Nano), a.ended.Format(time.RFC3339Nano), a.ctrFinished.Format(time.RFC3339),
				r.pod, r.admitted.Format(time.RFC3339Nano), r.started.Format(time.RFC3339Nano), r.ctrStarted.Format(time.RFC3339))
		}
		if r.token <= a.token {
			t.Errorf("the token went from %d (%s) to %d (%s); it only grows", a.token, a.pod, r.token, r.pod)
		}
		// The line lets pods in by queued-at: no pod is let in while one
		// queued before it waits. Two pods of one schedule are queued
		// microseconds apart, and the later one may reach the manager's
		// cache first and take a free slot at once; so a pod counts as
		// waiting from a second after it was queued.
		for _, b := range runs[:i] {
			if r.queued.Before(b.queued) && r.queued.Before(b.admitted.Add(-time.Second)) {
				t.Errorf("%s was let in at %s while %s, queued before it (%s against %s), waited: not in the order of the line",
					b.pod, b.admitted.Format(time.RFC3339Nano), r.pod, r.queued.Format(time.RFC3339Nano), b.queued.Format(time.RFC3339Nano))
			}
		}
		// The slot frees when the pod finishes, not when a ttl of 2h
		// plus grace runs out: the next pod starts within seconds.
		gap := r.ctrStarted.Sub(a.ctrFinished)
		t.Logf("%s -> %s: container finished to next container started %s (whole seconds); report's end to the next let in %s, to the next report's start %s",
			a.pod, r.pod, gap, r.admitted.Sub(a.ended).Round(time.Millisecond), r.started.Sub(a.ended).Round(time.Millisecond))
		if gap > 30*time.Second {
			t.Errorf("%s started %s after %s finished; the lock should pass on within seconds", r.pod, gap, a.pod)
		}
	}
	// Both CronJobs ran: the lock, not Forbid, kept them apart. And a pod
	// was told it waited in line (the other CronJob's pod held the lock).
	if len(cronJobs) != 2 {
		t.Errorf("the runs came from %d CronJobs (%v), want both of %q", len(cronJobs), cronJobs, names)
	}
	told := false
	for _, r := range runs {
		told = told || strings.Contains(r.waitingEvents, "number 1 in line for lock \""+lock+"\"")
	}
	if !told {
		t.Errorf("no finished pod got a Waiting event with its place in line")
	}
	if most != 1 {
		t.Errorf("at most %d pods held the lock at once, want 1", most)
	}

	// Deleting the CronJobs removes their Jobs and pods, a waiting or a
	// running one alike, and the lock is freed with them.
	for _, n := range names {
		if err := c.Client.BatchV1().CronJobs(ns).Delete(ctx, n, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
			t.Fatal(err)
		}
	}
	await(t, "the CronJobs' pods are gone and the lock is free", 3*time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return len(pods.Items) == 0 && len(permitsOf(t, ctx, ns, lock)) == 0, nil
	})
}

// TestGatedDeployment: examples/deployment-semaphore, four replicas on a
// lock of two slots: two pods run with slots 0 and 1, two wait at their
// gate on no node; the Deployment never becomes complete; a rolling update
// with the example's strategy goes through, never with more than two pods
// holding the lock.
func TestGatedDeployment(t *testing.T) {
	needInstall(t)
	ctx := context.Background()
	const ns = semaphoreNS
	createNamespace(t, ctx, ns)
	dir := filepath.Join(root, "examples", "deployment-semaphore")
	if _, err := c.Kubectl(ctx, bin, "apply", "-f", filepath.Join(dir, "rbac.yaml")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(b, &d); err != nil {
		t.Fatal(err)
	}
	if d.Namespace != ns {
		t.Fatalf("the example's namespace is %q, want %q", d.Namespace, ns)
	}
	lock, limit := d.Spec.Template.Annotations[gateName], d.Spec.Template.Annotations["locks.queen.dev/limit"]
	replicas := int(ptr.Deref(d.Spec.Replicas, 1))
	n, err := strconv.Atoi(limit)
	if err != nil || n >= replicas || lock == "" {
		t.Fatalf("examples/deployment-semaphore: lock %q, limit %q, %d replicas; want a limit under the replicas", lock, limit, replicas)
	}
	// What the test changes: the pause image (the node's sandbox image,
	// which waits for SIGTERM) for the renderer; and a short progress
	// deadline, to see what the README says of it.
	ctr := &d.Spec.Template.Spec.Containers[0]
	ctr.Image, ctr.ImagePullPolicy = cluster.PauseImage, corev1.PullNever
	d.Spec.ProgressDeadlineSeconds = ptr.To[int32](10)
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, &d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// settled: replicas pods of the Deployment's current ReplicaSet, limit
	// of them running with distinct slots, the rest waiting at the gate on
	// no node. At every look: never more than limit pods holding a slot.
	most := 0
	settled := func(ctx context.Context, hash string) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=renderer"})
		if err != nil {
			return false, err
		}
		h := holding(pods.Items)
		most = max(most, len(h))
		slots := map[string]string{}
		for _, p := range h {
			if other, taken := slots[p.Annotations[slotAnn]]; taken {
				return false, fmt.Errorf("%s and %s both hold slot %s", other, p.Name, p.Annotations[slotAnn])
			}
			slots[p.Annotations[slotAnn]] = p.Name
		}
		if len(h) > n {
			return false, fmt.Errorf("%d pods hold lock %q of limit %d", len(h), lock, n)
		}
		running, waiting := 0, 0
		for i := range pods.Items {
			p := &pods.Items[i]
			if (hash != "" && p.Labels["pod-template-hash"] != hash) || p.DeletionTimestamp != nil {
				return false, nil
			}
			switch {
			case gated(p) && p.Spec.NodeName == "" && p.Status.Phase == corev1.PodPending:
				waiting++
			case !gated(p) && ready(*p):
				running++
			}
		}
		return len(pods.Items) == replicas && running == n && waiting == replicas-n && len(slots) == n, nil
	}
	current := func(ctx context.Context) (string, error) {
		dep, err := c.Client.AppsV1().Deployments(ns).Get(ctx, d.Name, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		rss, err := c.Client.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=renderer"})
		if err != nil {
			return "", err
		}
		for _, rs := range rss.Items {
			if rs.Annotations["deployment.kubernetes.io/revision"] == dep.Annotations["deployment.kubernetes.io/revision"] {
				return rs.Labels["pod-template-hash"], nil
			}
		}
		return "", nil
	}
	await(t, fmt.Sprintf("%d renderers run and %d wait", n, replicas-n), 2*time.Minute, func(ctx context.Context) (bool, error) {
		return settled(ctx, "")
	})
	if got := permitsOf(t, ctx, ns, lock); len(got) != n {
		t.Errorf("lock %q has permits %q, want %d", lock, got, n)
	}
	// Two of four are available for good: the Deployment's progress
	// deadline passes.
	await(t, "the Deployment reports ProgressDeadlineExceeded", 2*time.Minute, func(ctx context.Context) (bool, error) {
		dep, err := c.Client.AppsV1().Deployments(ns).Get(ctx, d.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cond := range dep.Status.Conditions {
			if cond.Type == appsv1.DeploymentProgressing {
				return cond.Status == corev1.ConditionFalse && cond.Reason == "ProgressDeadlineExceeded", nil
			}
		}
		return false, nil
	})

	// A rolling update with the example's strategy completes: every pod
	// is of the new ReplicaSet, n of them running.
	old, err := current(ctx)
	if err != nil || old == "" {
		t.Fatalf("the Deployment's ReplicaSet: %q %v", old, err)
	}
	patch := `{"spec":{"template":{"metadata":{"annotations":{"e2e.queen.dev/rollout":"1"}}}}}`
	if _, err := c.Client.AppsV1().Deployments(ns).Patch(ctx, d.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	await(t, "the rolling update is through", 3*time.Minute, func(ctx context.Context) (bool, error) {
		hash, err := current(ctx)
		if err != nil || hash == "" || hash == old {
			return false, err
		}
		return settled(ctx, hash)
	})
	t.Logf("rolled out in %s; at most %d pods held lock %q at once", time.Since(start).Round(time.Second), most, lock)
	if most != n {
		t.Errorf("at most %d pods held the lock at once, want %d", most, n)
	}

	if err := c.Client.AppsV1().Deployments(ns).Delete(ctx, d.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	await(t, "the renderers are gone and the lock is free", 3*time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return len(pods.Items) == 0 && len(permitsOf(t, ctx, ns, lock)) == 0, nil
	})
}
