package main

import (
	"bufio"
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

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/internal/controlplane"
)

func nsObj(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

func waitRoute(t handle.Transport) {
	for range 100 {
		if _, err := t.Get(context.Background(), "warm-up"); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func post(url, body string) error {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || strings.Contains(string(b), `"acquired":false`) {
		return fmt.Errorf("batch answered %d: %.200s", resp.StatusCode, b)
	}
	return nil
}

// renewLoad holds n permits and renews each every 10 s for 20 s.
func renewLoad(t handle.Transport, n int) (result, int, error) {
	ctx := context.Background()
	type held struct {
		name  string
		token uint64
	}
	hs := make([]held, n)
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	var firstErr error
	var mu sync.Mutex
	prefix := fmt.Sprintf("renew%d", n)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			name := fmt.Sprintf("%s-%d", prefix, i)
			a, err := t.Acquire(ctx, name, "r", 30, 1)
			mu.Lock()
			defer mu.Unlock()
			if err != nil || !a.Acquired {
				if firstErr == nil {
					firstErr = fmt.Errorf("acquire %s: %v %s", name, err, a.Reason)
				}
				return
			}
			hs[i] = held{name, a.Token}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return result{}, 0, firstErr
	}
	var lat []time.Duration
	lost := 0
	end := time.Now().Add(20 * time.Second)
	for i := range hs {
		wg.Go(func() {
			next := time.Now().Add(time.Duration(rand.Int64N(int64(10 * time.Second))))
			for next.Before(end) {
				time.Sleep(time.Until(next))
				t0 := time.Now()
				r, err := t.Renew(ctx, hs[i].name, 0, hs[i].token, "r", 30)
				d := time.Since(t0)
				mu.Lock()
				if err != nil || !r.Renewed {
					lost++
				} else {
					hs[i].token = r.Token
					lat = append(lat, d)
				}
				mu.Unlock()
				next = next.Add(10 * time.Second)
			}
		})
	}
	wg.Wait()
	// Let them go, so the next step starts from an empty lock set.
	for i := range hs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_, _ = t.Release(ctx, hs[i].name, 0, hs[i].token, "r")
		})
	}
	wg.Wait()
	r := result{cycles: len(lat)}
	r.p50, r.p99 = percentile(lat, 50), percentile(lat, 99)
	return r, lost, nil
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
					firstErr = fmt.Errorf("acquire mem-%d: %v", i, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return firstErr
}

func rss() int64 { return statusKB("VmRSS:") * 1024 }

func memTotal() string {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if f := strings.Fields(s.Text()); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return fmt.Sprintf("%.0f GiB", float64(kb)/1024/1024)
		}
	}
	return "unknown"
}

func statusKB(key string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if f := strings.Fields(s.Text()); len(f) >= 2 && f[0] == key {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb
		}
	}
	return 0
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
