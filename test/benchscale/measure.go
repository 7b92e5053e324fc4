package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/test/internal/promtext"
)

// lags is one sample of latencies.
type lags struct {
	n, missed int
	p50, p99  time.Duration
}

func lagsOf(d []time.Duration, missed int) lags {
	return lags{n: len(d), missed: missed, p50: percentile(d, 50), p99: percentile(d, 99)}
}

// restartWithin is how long the manager may take to be back after a
// restart before the step fails.
const restartWithin = 10 * time.Minute

// seenWithin is how long a timed delete may take before it counts as
// missed.
const seenWithin = 2 * time.Minute

// expiryLag creates n permits of ttl (no holder pod) spread over the
// namespaces, and times each delete the watch sees from its expireTime
// plus the manager's grace, when the controller may first delete it.
func (s *scale) expiryLag(ctx context.Context, step, n int, ttl int64) (lags, error) {
	ws := make([]awaited, n)
	err := parallel(ctx, s.f.workers, 0, n, func(ctx context.Context, j int) error {
		ns, lock := s.f.spread(j, n), fmt.Sprintf("expiry-%d-%d", step, j)
		key := permitKey(ns, lock)
		seen := s.del.expect(key)
		a, err := s.f.locks.Acquire(ctx, ns, lock, "expiring", ttl, 1)
		if err != nil || !a.Acquired {
			s.del.forget(key)
			return fmt.Errorf("acquiring %s/%s: %+v %w", ns, lock, a, err)
		}
		ws[j] = awaited{key: key, due: a.ExpiresAt.Add(s.grace), seen: seen}
		return nil
	})
	if err != nil {
		return lags{}, err
	}
	d, missed, err := s.del.collect(ctx, ws, time.Now().Add(time.Duration(ttl)*time.Second+s.grace+seenWithin))
	return lagsOf(d, len(missed)), err
}

// podGoneLag deletes the pods of n held permits, spread over the fleet,
// one after another, and times each permit's delete the watch sees from
// the moment its pod's delete returned. Then it makes the pods and their
// permits again (the same names; new pods, new UIDs), so that as many
// permits are held as before.
func (s *scale) podGoneLag(ctx context.Context, n int) (lags, error) {
	f := s.f
	n = min(n, len(f.held))
	idx := make([]int, n)
	ws := make([]awaited, n)
	for j := range n {
		i := j * len(f.held) / n
		idx[j] = i
		h := f.held[i]
		key := permitKey(h.ns, h.lock)
		seen := s.del.expect(key)
		uid := h.uid
		err := f.cs.CoreV1().Pods(h.ns).Delete(ctx, h.pod, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil {
			s.del.forget(key)
			return lags{}, fmt.Errorf("deleting pod %s/%s: %w", h.ns, h.pod, err)
		}
		ws[j] = awaited{key: key, due: time.Now(), seen: seen}
	}
	d, missed, err := s.del.collect(ctx, ws, time.Now().Add(seenWithin))
	if err != nil {
		return lags{}, err
	}
	// A permit the controller did not free in time is deleted here, so
	// that it can be taken again for the new pod.
	for _, key := range missed {
		ns, name, _ := strings.Cut(key, "/")
		p := &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if err := f.c.Delete(ctx, p); err != nil && !apierrors.IsNotFound(err) {
			return lags{}, fmt.Errorf("deleting permit %s the controller did not free: %w", key, err)
		}
	}
	err = parallel(ctx, f.workers, 0, n, func(ctx context.Context, j int) error {
		h := &f.held[idx[j]]
		var err error
		for try := 0; ; try++ {
			if h.uid, err = f.hold(ctx, h.ns, h.pod, h.lock); err == nil || try == 50 {
				return err
			}
			// A permit deleted by hand above may still be going.
			time.Sleep(100 * time.Millisecond)
		}
	})
	return lagsOf(d, len(missed)), err
}

// routeAcquires acquires n fresh locks through the manager's route, one
// after another, each in a namespace that holds permits, and releases
// each after its acquire; only the acquires are timed. The caller is
// fresh: a new HTTP client, so the first call also opens its connection.
func (s *scale) routeAcquires(ctx context.Context, step, n int) (lags, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	hc := &http.Client{Timeout: 30 * time.Second, Transport: tr}
	var d []time.Duration
	for j := range n {
		ns, lock := s.f.spread(j, n), fmt.Sprintf("route-%d-%d", step, j)
		t := handle.HTTP(s.mgr.routeURL, handle.HTTPOptions{Namespace: ns, Client: hc})
		t0 := time.Now()
		a, err := t.Acquire(ctx, lock, "route-caller", 30, 1)
		took := time.Since(t0)
		if err != nil || !a.Acquired {
			return lags{}, fmt.Errorf("acquiring %s/%s through the route: %+v %w", ns, lock, a, err)
		}
		d = append(d, took)
		if ok, err := t.Release(ctx, lock, 0, a.Token, "route-caller"); err != nil || !ok {
			return lags{}, fmt.Errorf("releasing %s/%s through the route: %v %w", ns, lock, ok, err)
		}
	}
	return lagsOf(d, 0), nil
}

// restart is how the manager came back after a SIGTERM, each time from
// the start of the new process.
type restart struct {
	stop time.Duration // from SIGTERM to the old process's exit
	// ready: /readyz answered OK; leader: the manager reported itself
	// leader of the expiry Lease.
	ready, leader time.Duration
	// expired: a permit that expired while the manager was down was
	// deleted; podGone: a permit whose pod was deleted while it was down
	// was freed. Zero when the probe did not apply (see note).
	expired, podGone time.Duration
	// followed: the followed-pods gauge reached the held count; watches:
	// kube-apiserver counted an open pod watch for each namespace that
	// holds permits.
	followed, watches time.Duration
	note              string
}

// restartManager stops the manager with SIGTERM and starts it again, and
// times its return. Before the stop it takes two probes: a permit with a
// short TTL, which expires while the manager is down, and a pod holding a
// permit, which is deleted while it is down.
func (s *scale) restartManager(ctx context.Context, step int) (restart, error) {
	var r restart
	f := s.f
	ns := nsName(0)
	probePod, probeLock := fmt.Sprintf("probe-%d", step), fmt.Sprintf("probe-pod-%d", step)
	uid, err := f.hold(ctx, ns, probePod, probeLock)
	if err != nil {
		return r, err
	}
	podGone := s.del.expect(permitKey(ns, probeLock))
	expLock := fmt.Sprintf("probe-expiry-%d", step)
	expired := s.del.expect(permitKey(ns, expLock))
	// Due in 3 s plus the grace: past it once the manager has stopped.
	a, err := f.locks.Acquire(ctx, ns, expLock, "probe", 3, 1)
	if err != nil || !a.Acquired {
		return r, fmt.Errorf("acquiring the expiry probe: %+v %w", a, err)
	}
	due := a.ExpiresAt.Add(s.grace)

	if r.stop, err = s.mgr.stop(time.Minute); err != nil {
		return r, err
	}
	if err := f.cs.CoreV1().Pods(ns).Delete(ctx, probePod, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil {
		return r, fmt.Errorf("deleting the probe pod: %w", err)
	}
	expiredBefore := false
	select {
	case <-expired:
		// The old manager deleted it before it stopped.
		expiredBefore = true
		r.note = fmt.Sprintf("the expiry probe was deleted before the manager stopped (its stop took %s)", dur(r.stop))
	default:
		// It is to be overdue when the manager starts.
		if wait := time.Until(due.Add(500 * time.Millisecond)); wait > 0 {
			time.Sleep(wait)
		}
	}

	start := time.Now()
	if err := s.mgr.start(); err != nil {
		return r, err
	}
	since := func() time.Duration { return time.Since(start) }
	deadline := time.NewTimer(restartWithin)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	held, spaces := float64(len(f.held)), float64(f.usedNS())
	for n := 0; ; n++ {
		if r.ready == 0 && s.mgr.ready(ctx) {
			r.ready = since()
		}
		if r.leader == 0 || r.followed == 0 {
			if mm, err := s.mgr.metrics(ctx); err == nil {
				if r.leader == 0 && mm.leader {
					r.leader = since()
				}
				if r.followed == 0 && mm.leader && mm.followed >= held {
					r.followed = since()
				}
			}
		}
		if r.watches == 0 && n%5 == 0 {
			// kube-apiserver's metrics are a large page: every half second.
			if w, err := apiserverWatches(ctx, s.cs); err == nil && w["pods"] >= s.podWatchBase+spaces {
				r.watches = since()
			}
		}
		if r.expired == 0 && !expiredBefore {
			select {
			case at := <-expired:
				r.expired = at.Sub(start)
			default:
			}
		}
		if r.podGone == 0 {
			select {
			case at := <-podGone:
				r.podGone = at.Sub(start)
			default:
			}
		}
		if r.ready > 0 && r.leader > 0 && r.followed > 0 && r.watches > 0 && (r.expired > 0 || expiredBefore) && r.podGone > 0 {
			return r, nil
		}
		select {
		case <-tick.C:
		case <-s.mgr.proc.Done():
			return r, fmt.Errorf("the manager exited after its restart; see its log")
		case <-deadline.C:
			return r, fmt.Errorf("the manager was not back within %s of its restart: %+v", since(), r)
		case <-ctx.Done():
			return r, ctx.Err()
		}
	}
}

// scrapeAPIServer reads kube-apiserver's /metrics as the admin.
func scrapeAPIServer(ctx context.Context, cs kubernetes.Interface) ([]byte, error) {
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading kube-apiserver's /metrics: %w", err)
	}
	return raw, nil
}

// apiserverWatches reads kube-apiserver's open watches by resource.
func apiserverWatches(ctx context.Context, cs kubernetes.Interface) (map[string]float64, error) {
	raw, err := scrapeAPIServer(ctx, cs)
	if err != nil {
		return nil, err
	}
	s, err := promtext.Parse(bytes.NewReader(raw), longRunning)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver's /metrics: %w", err)
	}
	return watchesByResource(s), nil
}
