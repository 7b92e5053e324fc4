package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/test/internal/procfs"
)

// The dashboard section runs the Locks page's own measurement,
// internal/dashboard's TestPageAtScale, which drives Debian's Chromium over
// the DevTools protocol against a control plane of its own, and reports
// the figures it writes.

// pageFigures mirror what TestPageAtScale writes (internal/dashboard's
// bench_test.go).
type pageFigures struct {
	Permits   int     `json:"permits"`
	AcquireMs float64 `json:"acquireMs"`
	RenderMs  float64 `json:"renderMs"`
	Rate      int     `json:"rate"`
	Renews    int     `json:"renews"`
	Shown     int     `json:"shown"`
	NotShown  int     `json:"notShown"`
	LagP50Ms  float64 `json:"lagP50Ms"`
	LagP99Ms  float64 `json:"lagP99Ms"`
	LagMaxMs  float64 `json:"lagMaxMs"`
}

// pageTimeout bounds the test's run, its build and control plane included.
const pageTimeout = 15 * time.Minute

// runPageAtScale runs the test once and answers its figures.
func runPageAtScale(dir string) (pageFigures, error) {
	out := filepath.Join(dir, "page.json")
	cmd := exec.Command("go", "test", "-count=1", "-timeout", pageTimeout.String(), "-run", "^TestPageAtScale$", "-v", "./internal/dashboard/")
	cmd.Dir = controlplane.Root()
	cmd.Env = append(os.Environ(), "QUEEN_LOCKS_DASHBOARD_BENCH=1", "QUEEN_LOCKS_DASHBOARD_BENCH_OUT="+out)
	log, err := cmd.CombinedOutput()
	if err != nil {
		return pageFigures{}, fmt.Errorf("TestPageAtScale: %w\n%s", err, log)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		// It passed without writing: it skipped (no Chromium, say).
		return pageFigures{}, fmt.Errorf("TestPageAtScale wrote no figures:\n%s", log)
	}
	var f pageFigures
	if err := json.Unmarshal(raw, &f); err != nil {
		return pageFigures{}, fmt.Errorf("TestPageAtScale's figures: %w", err)
	}
	return f, nil
}

// dashboard measures the Locks page at 10,000 held permits.
func (bn *bench) dashboard() error {
	dir, err := os.MkdirTemp("", "queen-bench-page-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	loadStart, t0 := procfs.LoadAvg(), time.Now()
	f, err := runPageAtScale(dir)
	if err != nil {
		return err
	}
	fmt.Fprintf(&bn.b, "\n## The Locks page at %d held permits\n\n"+
		"`QUEEN_LOCKS_DASHBOARD_BENCH=1 go test ./internal/dashboard -run TestPageAtScale`, run by this benchmark: a control plane of the test's own, "+
		"%d permits held in one namespace (16 acquires at a time), `queenlock dashboard`'s server for that namespace, and Debian's Chromium, headless, driven over the DevTools protocol. "+
		"The page is opened from blank and timed until its table holds every row; then %d permits a second are renewed for %d s, each at a row of its own, "+
		"and a MutationObserver in the page stamps when each row shows its new token. The lag runs from the renew's answer (this machine's clock) to that stamp; "+
		"the test awaits the last renew on the page for up to two minutes, and a renew not shown by then is counted apart. "+
		"Load average (1, 5, 15 min) %s at the start, %s at the end; the section took %s, the test's build and control plane included.\n\n"+
		"| what | figure |\n|---|---:|\n"+
		"| %d permits held (before the page opens) | %s |\n"+
		"| page opened to the %dth row rendered | %s |\n"+
		"| renews at %d/s, answered | %d |\n"+
		"| of those, shown on the page | %d (%d not shown) |\n"+
		"| renew's answer to its row's new token, p50 | %s |\n"+
		"| p99 | %s |\n"+
		"| most | %s |\n",
		f.Permits, f.Permits, f.Rate, f.Renews/max(1, f.Rate), loadStart, procfs.LoadAvg(), time.Since(t0).Round(time.Second),
		f.Permits, msf(f.AcquireMs), f.Permits, msf(f.RenderMs), f.Rate, f.Renews, f.Shown, f.NotShown, msf(f.LagP50Ms), msf(f.LagP99Ms), msf(f.LagMaxMs))
	bn.sum.page = &f
	return nil
}

// msf writes milliseconds, as seconds from ten seconds on.
func msf(v float64) string {
	if v >= 10000 {
		return fmt.Sprintf("%.1f s", v/1000)
	}
	return fmt.Sprintf("%.1f ms", v)
}
