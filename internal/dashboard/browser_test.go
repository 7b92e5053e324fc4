package dashboard_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/dashboard"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/permit/gatedpod"
)

// ScreenshotsEnv, set to a directory (or to 1 for the repository's
// docs/images), makes the browser test save the screenshots the docs use.
const ScreenshotsEnv = "QUEEN_LOCKS_SCREENSHOTS"

// chromium finds Debian's Chromium. Without it the browser test skips,
// except in CI (CI=true), where a missing browser is a failure:
// hack/handles/chromium.sh installs it.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed (hack/handles/chromium.sh installs it); CI=true runs the browser test")
	}
	t.Skip("chromium is not installed: the browser test needs it (apt-get install chromium, or hack/handles/chromium.sh)")
	return ""
}

// browser starts a headless Chromium of its own profile for the test.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := chromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	actx, acancel := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Headless,
		chromedp.NoSandbox, // as root, as CI runs it
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("metrics-recording-only", true),
		chromedp.WindowSize(1500, 950),
	)
	t.Cleanup(acancel)
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(bcancel)
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return bctx
}

// tab opens a new tab of the browser at url.
func tab(t *testing.T, browser context.Context, url string) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browser)
	t.Cleanup(cancel)
	run(t, ctx, chromedp.Navigate(url))
	// Set once: a reload would lose it, so the live checks can prove they
	// saw the change without one.
	eval[string](t, ctx, `window.noReload = "still here"`)
	return ctx
}

func run(t *testing.T, ctx context.Context, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatal(err)
	}
}

// wait polls a JavaScript condition on the page until it holds.
func wait(t *testing.T, ctx context.Context, what, cond string) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](cond, chromedp.WithPollingTimeout(time.Minute))); err != nil {
		html, _ := chromedp.Run(ctx, chromedp.OuterHTML("body"))
		t.Fatalf("awaiting %s (%s): %v\npage: %.3000s", what, cond, err, html)
	}
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	return v
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv(ScreenshotsEnv)
	if dir == "" {
		return
	}
	if dir == "1" {
		dir = filepath.Join(controlplane.Root(), "docs", "images")
	}
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "dashboard-"+name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// rowSel selects a permit's row.
func rowSel(ns, name string) string { return fmt.Sprintf(`tr[data-key="%s/%s"]`, ns, name) }

// press sends one key the way a keyboard does.
func press(t *testing.T, ctx context.Context, key string) {
	t.Helper()
	run(t, ctx, chromedp.KeyEvent(key))
}

// tabTo presses Tab until the element the condition names has the focus.
func tabTo(t *testing.T, ctx context.Context, what, cond string) {
	t.Helper()
	for range 60 {
		if eval[bool](t, ctx, cond) {
			return
		}
		press(t, ctx, kb.Tab)
	}
	t.Fatalf("Tab never reached %s", what)
}

// The Locks page in Debian's Chromium, as three people with real
// credentials: a viewer, an on-call engineer who may release, and
// somebody with no rights in the namespace.
func TestLocksPageInABrowser(t *testing.T) {
	b := browser(t)
	ctx := context.Background()
	ns := env.Namespace(t, "team")
	elsewhere := env.Namespace(t, "elsewhere")

	// What there is: a lock stuck past its expiry with two pods waiting
	// behind it, a held lock that guards a ConfigMap, and a semaphore.
	stuck := acquire(t, ns, "nightly-report", "cron-7", 1)
	backup := acquire(t, ns, "daily-backup", "backup-2", 3600)
	for i := range 2 {
		if _, err := lockClient().Acquire(ctx, ns, "workers", fmt.Sprintf("worker-%d", i), 900, 3); err != nil {
			t.Fatal(err)
		}
	}
	for i, name := range []string{"nightly-report-29170-a1b2c", "nightly-report-29171-d3e4f"} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
				Labels: map[string]string{gatedpod.Label: gatedpod.LabelValue},
				Annotations: map[string]string{gatedpod.LockAnnotation: "nightly-report",
					gatedpod.QueuedAt: time.Now().Add(time.Duration(i-2) * time.Minute).UTC().Format(gatedpod.TimeFormat)}},
			Spec: corev1.PodSpec{SchedulingGates: []corev1.PodSchedulingGate{{Name: gatedpod.Gate}},
				Containers: []corev1.Container{{Name: "report", Image: "report"}}},
		}
		if err := env.Client.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "backup-state",
		Labels:      map[string]string{permit.GuardedLabel: "true"},
		Annotations: map[string]string{permit.GuardAnnotation: permit.Guard{Lock: "daily-backup", Token: backup.Token}.String()}},
		Data: map[string]string{"last": "2026-12-05"}}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	reader := []string{"dashboard-test-reader"}
	viewer := identity(t, ns, "viewer", map[string][]string{ns: append([]string{"queen-locks-viewer"}, reader...)})
	oncall := identity(t, ns, "oncall", map[string][]string{ns: append([]string{"queen-locks-holder"}, reader...)})
	stranger := identity(t, elsewhere, "stranger", map[string][]string{elsewhere: append([]string{"queen-locks-holder"}, reader...)})

	t.Run("viewer", func(t *testing.T) {
		s := serve(t, viewer, dashboard.Options{Namespace: ns})
		page := tab(t, b, s.URL)
		wait(t, page, "every permit", `document.body.dataset.rendered === "4"`)
		wait(t, page, "the stuck permit overdue", `document.querySelector('`+rowSel(ns, "nightly-report.0")+`.overdue .expires')?.textContent.includes("overdue")`)
		wait(t, page, "the line", `document.querySelectorAll("#waiters tbody tr").length === 2`)
		wait(t, page, "the guarded ConfigMap", `document.querySelector("#guarded tbody")?.textContent.includes("ConfigMap backup-state")`)
		if got := eval[string](t, page, `document.querySelector("#waiters tbody tr").textContent`); !strings.Contains(got, "1 of 2") || !strings.Contains(got, "nightly-report-29170-a1b2c") {
			t.Errorf("head of the line: %q", got)
		}
		if got := eval[string](t, page, `document.querySelector('`+rowSel(ns, "nightly-report.0")+` .waiting').textContent`); got != "2" {
			t.Errorf("waiting behind nightly-report: %q, want 2", got)
		}
		if got := eval[string](t, page, `document.querySelector('`+rowSel(ns, "daily-backup.0")+` .guarded').textContent`); got != "ConfigMap backup-state" {
			t.Errorf("guarded by daily-backup: %q", got)
		}
		if n := eval[int](t, page, `document.querySelectorAll("button.release").length`); n != 0 {
			t.Fatalf("a viewer sees %d release buttons", n)
		}
		screenshot(t, page, "viewer")

		// A release forged from the page itself is refused by the API
		// server, not by the page.
		forged, err := chromedp.Run(page, chromedp.Evaluate[map[string]any](fmt.Sprintf(`fetch("release", {method: "POST", headers: {"Content-Type": "application/json"},
			body: JSON.stringify({namespace: %q, name: "nightly-report.0", token: %q})}).then(async r => ({status: r.status, body: await r.json()}))`,
			ns, tokenString(stuck.Token)), chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatal(err)
		}
		if forged["status"] != float64(403) || !strings.Contains(fmt.Sprint(forged["body"]), "forbidden") {
			t.Fatalf("forged release: %v", forged)
		}
		if !held(t, ns, "nightly-report.0", stuck.Token) {
			t.Fatal("the forged release deleted the permit")
		}

		// An acquire, a renew and a release made elsewhere show up
		// without a reload.
		a := acquire(t, ns, "adhoc-migration", "alice", 300)
		wait(t, page, "the acquire", `document.querySelector('`+rowSel(ns, "adhoc-migration.0")+`')?.dataset.token === "`+tokenString(a.Token)+`"`)
		r, err := lockClient().Renew(ctx, ns, "adhoc-migration", 0, a.Token, "alice", 300)
		if err != nil || !r.Renewed {
			t.Fatal(r, err)
		}
		wait(t, page, "the renew", `document.querySelector('`+rowSel(ns, "adhoc-migration.0")+`')?.dataset.token === "`+tokenString(r.Token)+`"`)
		if ok, err := lockClient().Release(ctx, ns, "adhoc-migration", 0, r.Token, "alice"); err != nil || !ok {
			t.Fatal(ok, err)
		}
		wait(t, page, "the release", `document.querySelector('`+rowSel(ns, "adhoc-migration.0")+`') === null`)
		if got := eval[string](t, page, `window.noReload`); got != "still here" {
			t.Fatalf("the page was reloaded (%q)", got)
		}

		// Filter and sort.
		run(t, page, chromedp.SendKeys("#filter", "backup"))
		wait(t, page, "the filter", `[...document.querySelectorAll("#permits tbody tr")].filter(r => !r.hidden).map(r => r.dataset.lock).join() === "daily-backup"`)
		eval[bool](t, page, `(() => { const f = document.querySelector("#filter"); f.value = ""; return f.dispatchEvent(new Event("input")) })()`)
		run(t, page, chromedp.Click(`button[data-sort="since"]`))
		wait(t, page, "sorted by since", `document.querySelector('button[data-sort="since"]').parentElement.getAttribute("aria-sort") === "ascending" &&
			document.querySelector("#permits tbody tr").dataset.lock === "nightly-report"`)
		run(t, page, chromedp.Click(`button[data-sort="since"]`))
		wait(t, page, "sorted by since, latest first", `document.querySelector('button[data-sort="since"]').parentElement.getAttribute("aria-sort") === "descending" &&
			document.querySelector("#permits tbody tr").dataset.lock === "workers"`)
		run(t, page, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
				Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}})
			return err
		}))
		screenshot(t, page, "dark")
	})

	t.Run("oncall releases with the keyboard", func(t *testing.T) {
		s := serve(t, oncall, dashboard.Options{Namespace: ns})
		page := tab(t, b, s.URL)
		wait(t, page, "release buttons", `document.querySelectorAll("button.release").length === 4`)
		// The stuck permit sorts first by expiry: Tab reaches its button.
		tabTo(t, page, "the stuck permit's release button", `document.activeElement?.getAttribute("aria-label") === "Release nightly-report slot 0"`)
		press(t, page, kb.Enter)
		wait(t, page, "the dialog, its Cancel focused", `document.querySelector("#confirm").open && document.activeElement.id === "confirm-cancel"`)
		screenshot(t, page, "confirm")
		// Escape takes it back, to where it came from.
		press(t, page, kb.Escape)
		wait(t, page, "the dialog closed, focus back", `!document.querySelector("#confirm").open && document.activeElement.getAttribute("aria-label") === "Release nightly-report slot 0"`)
		press(t, page, kb.Enter)
		wait(t, page, "the dialog again", `document.querySelector("#confirm").open && document.activeElement.id === "confirm-cancel"`)
		press(t, page, kb.Tab)
		wait(t, page, "Release focused", `document.activeElement.id === "confirm-release"`)
		press(t, page, kb.Enter)
		wait(t, page, "released", `document.querySelector("#notice").dataset.reason === "released" && document.activeElement.id === "notice"`)
		wait(t, page, "the row gone", `document.querySelector('`+rowSel(ns, "nightly-report.0")+`') === null`)
		if held(t, ns, "nightly-report.0", stuck.Token) {
			t.Fatal("the stuck permit is still there")
		}

		// A permit renewed between the page's load and the confirm is not
		// deleted, and the page says so.
		tabTo(t, page, "daily-backup's release button", `document.activeElement?.getAttribute("aria-label") === "Release daily-backup slot 0"`)
		press(t, page, kb.Enter)
		wait(t, page, "the dialog", `document.querySelector("#confirm").open`)
		r, err := lockClient().Renew(ctx, ns, "daily-backup", 0, backup.Token, "backup-2", 3600)
		if err != nil || !r.Renewed {
			t.Fatal(r, err)
		}
		wait(t, page, "the dialog's warning", `!document.querySelector("#confirm-changed").hidden`)
		press(t, page, kb.Tab)
		wait(t, page, "Release focused", `document.activeElement.id === "confirm-release"`)
		press(t, page, kb.Enter)
		wait(t, page, "refused", `document.querySelector("#notice").dataset.reason === "changed"`)
		text := eval[string](t, page, `document.querySelector("#notice").textContent`)
		if !strings.Contains(text, "Not released") || !strings.Contains(text, "renewed by backup-2") || !strings.Contains(text, tokenString(r.Token)) {
			t.Fatalf("the notice says %q", text)
		}
		if !held(t, ns, "daily-backup.0", r.Token) {
			t.Fatal("the renewed permit was deleted")
		}
		screenshot(t, page, "refused")
	})

	t.Run("stranger sees nothing", func(t *testing.T) {
		for _, o := range []dashboard.Options{{Namespace: ns}, {AllNamespaces: true}} {
			s := serve(t, stranger, o)
			page := tab(t, b, s.URL)
			wait(t, page, "the refusal", `document.querySelector('#problems li[data-source="permits"]')?.dataset.state === "forbidden"`)
			if n := eval[int](t, page, `document.querySelectorAll("#permits tbody tr, #waiters tbody tr, #guarded tbody tr").length`); n != 0 {
				t.Fatalf("%+v: the stranger sees %d rows", o, n)
			}
			if body := eval[string](t, page, `document.body.textContent`); strings.Contains(body, "daily-backup") || strings.Contains(body, "backup-state") {
				t.Fatalf("%+v: the page shows another namespace's locks", o)
			}
			if o.AllNamespaces {
				screenshot(t, page, "forbidden")
			}
		}
	})
}
