package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/queen-locks/queen-locks/internal/dashboard"
)

// BenchEnv, set to 1, runs TestPageAtScale: 10,000 held permits, and 100
// renews a second while the page is open. It is not part of make test (it
// takes minutes and a loaded machine), and asserts no timing: it reports.
const BenchEnv = "QUEEN_LOCKS_DASHBOARD_BENCH"

// BenchOutEnv names a file that TestPageAtScale writes its figures to, as
// JSON, for make bench's report (test/bench reads them).
const BenchOutEnv = "QUEEN_LOCKS_DASHBOARD_BENCH_OUT"

// pageFigures are what TestPageAtScale measured.
type pageFigures struct {
	Permits   int     `json:"permits"`
	AcquireMs float64 `json:"acquireMs"` // holding them all, 16 at a time
	RenderMs  float64 `json:"renderMs"`  // navigation to the last row in the table
	Rate      int     `json:"rate"`      // renews a second while the page is open
	Renews    int     `json:"renews"`    // renews answered
	Shown     int     `json:"shown"`     // of those, drawn on the page
	NotShown  int     `json:"notShown"`  // not shown when the last was, or two minutes on
	LagP50Ms  float64 `json:"lagP50Ms"`  // from a renew's answer to its row's new token
	LagP99Ms  float64 `json:"lagP99Ms"`
	LagMaxMs  float64 `json:"lagMaxMs"`
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// The page with 10,000 permits: how long until the 10,000th row is
// rendered, and how far behind the renews it shows at 100 a second.
func TestPageAtScale(t *testing.T) {
	if os.Getenv(BenchEnv) != "1" {
		t.Skip("set " + BenchEnv + "=1 to measure the page at 10,000 permits")
	}
	const permits, rate, seconds = 10000, 100, 20
	b := browser(t)
	ns := env.Namespace(t, "dash-scale")
	ctx := context.Background()
	lc := lockClient()
	tokens := make([]uint64, permits)
	var wg sync.WaitGroup
	errs := make(chan error, permits)
	work := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range work {
				a, err := lc.Acquire(ctx, ns, fmt.Sprintf("job-%05d", i), "bench", 3600, 1)
				if err != nil || !a.Acquired {
					errs <- fmt.Errorf("acquire %d: %+v %w", i, a, err)
					continue
				}
				tokens[i] = a.Token
			}
		})
	}
	start := time.Now()
	for i := range permits {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	acquired := time.Since(start)
	t.Logf("acquired %d permits in %v", permits, acquired.Round(time.Millisecond))

	s := serve(t, env.Config, dashboard.Options{Namespace: ns})
	page, cancel := chromedp.NewContext(b)
	t.Cleanup(cancel)
	run(t, page, chromedp.Navigate("about:blank"))
	start = time.Now()
	run(t, page, chromedp.Navigate(s.URL))
	wait(t, page, "every row", fmt.Sprintf(`document.body.dataset.rendered === "%d" && document.querySelectorAll("#permits tbody tr").length === %d`, permits, permits))
	render := time.Since(start)
	t.Logf("rows rendered: %d in %v (from navigation to the last row in the table)", permits, render.Round(time.Millisecond))

	// Each row's token as the page shows it, stamped with this machine's
	// clock when the page changed it.
	eval[bool](t, page, `(() => {
		window.seen = {};
		new MutationObserver((ms) => { const now = Date.now();
			for (const m of ms) if (m.attributeName === "data-token") window.seen[m.target.dataset.key + "@" + m.target.dataset.token] = now; })
			.observe(document.querySelector("#permits tbody"), {attributes: true, subtree: true, attributeFilter: ["data-token"]});
		return true })()`)
	type renewed struct {
		key, token string
		at         time.Time
	}
	var mu sync.Mutex
	var done []renewed
	tick := time.NewTicker(time.Second / rate)
	var rwg sync.WaitGroup
	for i := range rate * seconds {
		<-tick.C
		rwg.Go(func() {
			n := i % permits
			mu.Lock()
			tok := tokens[n]
			mu.Unlock()
			r, err := lc.Renew(ctx, ns, fmt.Sprintf("job-%05d", n), 0, tok, "bench", 3600)
			at := time.Now()
			if err != nil || !r.Renewed {
				t.Errorf("renew %d: %+v %v", n, r, err)
				return
			}
			mu.Lock()
			tokens[n] = r.Token
			done = append(done, renewed{key: ns + "/" + locksName(n), token: strconv.FormatUint(r.Token, 10), at: at})
			mu.Unlock()
		})
	}
	tick.Stop()
	rwg.Wait()
	// Await the last renews on the page, then read when each showed. A
	// page that falls behind is what this measures, not a failure: it
	// gets lastWait, each look bounded, since a page busy drawing answers
	// no evaluation until it is done.
	last := done[len(done)-1]
	const lastWait = 2 * time.Minute
	shownLast := fmt.Sprintf(`window.seen[%q] !== undefined`, last.key+"@"+last.token)
	for until := time.Now().Add(lastWait); ; time.Sleep(100 * time.Millisecond) {
		look, cancel := context.WithTimeout(page, 10*time.Second)
		ok, err := chromedp.Run(look, chromedp.Evaluate[bool](shownLast))
		cancel()
		if err == nil && ok {
			break
		}
		if time.Now().After(until) {
			t.Logf("the page had not shown the last renew %v after the renews ended", lastWait)
			break
		}
	}
	seen := eval[map[string]float64](t, page, `window.seen`)
	var lags []time.Duration
	missed := 0
	for _, r := range done {
		ms, ok := seen[r.key+"@"+r.token]
		if !ok {
			missed++ // not shown by then, or a later renew of its row came in the same frame
			continue
		}
		lags = append(lags, time.UnixMilli(int64(ms)).Sub(r.at))
	}
	if len(lags) == 0 {
		t.Fatalf("the page showed none of the %d renews", len(done))
	}
	sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
	pct := func(p int) time.Duration { return lags[min(len(lags)-1, len(lags)*p/100)] }
	t.Logf("renews: %d at %d/s for %ds; shown: %d (%d not shown); lag from the renew's answer to the row's new token: p50 %v, p99 %v, max %v",
		len(done), rate, seconds, len(lags), missed, pct(50).Round(time.Millisecond), pct(99).Round(time.Millisecond), lags[len(lags)-1].Round(time.Millisecond))
	if out := os.Getenv(BenchOutEnv); out != "" {
		raw, err := json.Marshal(pageFigures{Permits: permits, AcquireMs: millis(acquired), RenderMs: millis(render), Rate: rate,
			Renews: len(done), Shown: len(lags), NotShown: missed, LagP50Ms: millis(pct(50)), LagP99Ms: millis(pct(99)), LagMaxMs: millis(lags[len(lags)-1])})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(out, raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func locksName(i int) string { return fmt.Sprintf("job-%05d.0", i) }
