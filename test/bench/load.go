package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/test/internal/procfs"
)

func nsObj(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// waitRoute waits until the route answers through t.
func waitRoute(t handle.Transport) error {
	var err error
	for range 100 {
		if _, err = t.Get(context.Background(), "warm-up"); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the route never answered: %w", err)
}

// loadAvg1 is the machine's load average over the last minute.
func loadAvg1() string {
	l, _, _ := strings.Cut(procfs.LoadAvg(), ",")
	return l
}

func post(url, body string) error {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || strings.Contains(string(b), `"acquired":false`) {
		return fmt.Errorf("batch answered %d: %.200s", resp.StatusCode, b)
	}
	return nil
}

// holding is what a fleet holds: permits through a transport, or Leases.
type holding interface {
	acquire(ctx context.Context, name string) (token uint64, err error)
	// renew answers the new token, or why the holding was lost.
	renew(ctx context.Context, name string, token uint64) (uint64, string, error)
	release(ctx context.Context, name string, token uint64)
}

// permits holds lock permits through a transport.
type permits struct{ t handle.Transport }

func (p permits) acquire(ctx context.Context, name string) (uint64, error) {
	a, err := p.t.Acquire(ctx, name, "r", renewTTL, 1)
	if err == nil && !a.Acquired {
		err = fmt.Errorf("not acquired: %s", a.Reason)
	}
	return a.Token, err
}

func (p permits) renew(ctx context.Context, name string, token uint64) (uint64, string, error) {
	r, err := p.t.Renew(ctx, name, 0, token, "r", renewTTL)
	if err != nil || !r.Renewed {
		return 0, r.Reason, err
	}
	return r.Token, "", nil
}

func (p permits) release(ctx context.Context, name string, token uint64) {
	_, _ = p.t.Release(ctx, name, 0, token, "r")
}

// leases holds coordination.k8s.io Leases and renews them as a holder of
// a Lease does: one merge patch of renewTime, conditional on the
// resourceVersion, the same shape as a permit's renew through a handle's
// direct transport. With last set it renews as client-go's leader
// election does instead: an update of the whole Lease it last wrote, with
// a new renewTime, the same shape as the route's renew.
type leases struct {
	cs   kubernetes.Interface
	ns   string
	last *sync.Map // name to the *coordinationv1.Lease last written; nil: merge patches
}

func (l leases) acquire(ctx context.Context, name string) (uint64, error) {
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: coordinationv1.LeaseSpec{
		HolderIdentity: ptr.To("r"), LeaseDurationSeconds: ptr.To[int32](renewTTL), AcquireTime: &now, RenewTime: &now,
	}}
	got, err := l.cs.CoordinationV1().Leases(l.ns).Create(ctx, lease, metav1.CreateOptions{})
	if err != nil {
		return 0, err
	}
	if l.last != nil {
		l.last.Store(name, got)
	}
	return strconv.ParseUint(got.ResourceVersion, 10, 64)
}

func (l leases) renew(ctx context.Context, name string, token uint64) (uint64, string, error) {
	var got *coordinationv1.Lease
	var err error
	if l.last != nil {
		prev, _ := l.last.Load(name)
		next := prev.(*coordinationv1.Lease).DeepCopy()
		next.ResourceVersion = strconv.FormatUint(token, 10)
		next.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
		if got, err = l.cs.CoordinationV1().Leases(l.ns).Update(ctx, next, metav1.UpdateOptions{}); err == nil {
			l.last.Store(name, got)
		}
	} else {
		patch := fmt.Sprintf(`{"metadata":{"resourceVersion":"%d"},"spec":{"renewTime":%q}}`, token, time.Now().UTC().Format(metav1.RFC3339Micro))
		got, err = l.cs.CoordinationV1().Leases(l.ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	}
	if err != nil {
		return 0, "", err
	}
	tok, err := strconv.ParseUint(got.ResourceVersion, 10, 64)
	return tok, "", err
}

func (l leases) release(ctx context.Context, name string, token uint64) {
	rv := strconv.FormatUint(token, 10)
	_ = l.cs.CoordinationV1().Leases(l.ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
}

// fleet is a set of holdings, each renewed every renewEvery from when it
// was acquired, at its own phase, until stop: a steady renew load that
// grows between measurements without a pause.
type fleet struct {
	h    holding
	stop chan struct{}
	wg   sync.WaitGroup

	mu        sync.Mutex
	held      []*heldPermit
	recording bool
	inWindow  sync.WaitGroup // renews started while recording
	lat       []time.Duration
	lost      int
	why       map[string]int // why renews were lost, for the log
}

type heldPermit struct {
	name  string
	token uint64 // the fleet's mu guards it once its renewer runs
}

const (
	renewEvery = 10 * time.Second
	renewTTL   = 30 // renewEvery is a third of it
)

func newFleet(h holding) *fleet { return &fleet{h: h, stop: make(chan struct{})} }

// grow acquires permits, 32 at a time, until n are held, and starts
// renewing each.
func (f *fleet) grow(n int) error {
	ctx := context.Background()
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i := len(f.held); i < n; i++ {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			name := fmt.Sprint("renew-", i)
			// An acquire the API server did not carry out (503 from an
			// overloaded machine), or that a saturated route turned away
			// (429), is sent again after a pause, as the route asks: the
			// same owner converges on the same permit.
			var tok uint64
			var err error
			for try := range 6 {
				if try > 0 {
					time.Sleep(time.Duration(try) * 250 * time.Millisecond)
				}
				if tok, err = f.h.acquire(ctx, name); err == nil {
					break
				}
			}
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = fmt.Errorf("acquire %s: %w", name, err)
				}
				mu.Unlock()
				return
			}
			h := &heldPermit{name: name, token: tok}
			f.mu.Lock()
			f.held = append(f.held, h)
			f.mu.Unlock()
			f.wg.Go(func() { f.renew(h) })
		})
	}
	wg.Wait()
	return firstErr
}

// renew renews h every renewEvery, the first time at a random point of the
// first period, so that the fleet's renews spread evenly over time.
func (f *fleet) renew(h *heldPermit) {
	ctx := context.Background()
	timer := time.NewTimer(time.Duration(rand.Int64N(int64(renewEvery))))
	defer timer.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-timer.C:
		}
		timer.Reset(renewEvery)
		f.mu.Lock()
		rec, tok := f.recording, h.token
		if rec {
			f.inWindow.Add(1)
		}
		f.mu.Unlock()
		t0 := time.Now()
		newTok, why, err := f.h.renew(ctx, h.name, tok)
		d := time.Since(t0)
		f.mu.Lock()
		renewed := err == nil && why == ""
		if renewed {
			h.token = newTok
		}
		if rec {
			if !renewed {
				f.lost++
				if err != nil {
					why = err.Error()
				}
				f.why[why]++
			} else {
				f.lat = append(f.lat, d)
			}
			f.inWindow.Done()
		}
		f.mu.Unlock()
	}
}

// measure records the renews that start within the next d.
func (f *fleet) measure(d time.Duration) (result, int) {
	f.mu.Lock()
	f.recording, f.lat, f.lost, f.why = true, nil, 0, map[string]int{}
	f.mu.Unlock()
	time.Sleep(d)
	f.mu.Lock()
	f.recording = false
	f.mu.Unlock()
	// Renews that started in the window and are still running count too:
	// they are the slow ones.
	f.inWindow.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	for why, n := range f.why {
		fmt.Fprintf(os.Stderr, "\n%d renews lost: %s", n, why)
	}
	r := result{cycles: len(f.lat)}
	r.p50, r.p99 = percentile(f.lat, 50), percentile(f.lat, 99)
	return r, f.lost
}

// close stops renewing and releases every permit, 32 at a time.
func (f *fleet) close() {
	close(f.stop)
	f.wg.Wait()
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for _, h := range f.held {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			f.h.release(context.Background(), h.name, h.token)
		})
	}
	wg.Wait()
}

// holdMany acquires n permits with a long TTL, 32 at a time.
func holdMany(t handle.Transport, n int) error {
	ctx := context.Background()
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			a, err := t.Acquire(ctx, fmt.Sprint("mem-", i), "m", 3600, 1)
			if err != nil || !a.Acquired {
				mu.Lock()
				if firstErr == nil {
					firstErr = fmt.Errorf("acquire mem-%d: %v", i, err) //nolint:errorlint // err is nil when the call answered but did not acquire: %w would print %!w(<nil>)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return firstErr
}

func rss() int64 { return procfs.RSS("self") }

func memTotal() string {
	if b := procfs.Meminfo("MemTotal:"); b > 0 {
		return fmt.Sprintf("%.0f GiB", float64(b)/(1<<30))
	}
	return "unknown"
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/1024/1024) }

func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// waitCached waits until the manager's cache holds at least n permits.
func waitCached(env *controlplane.Env, n int) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		var list locksv1alpha1.QueenLockList
		if err := env.Manager.GetCache().List(context.Background(), &list); err != nil {
			return err
		}
		if len(list.Items) >= n {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("the manager's cache never held %d permits", n)
}
