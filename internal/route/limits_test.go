package route_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/route"
	"github.com/queen-locks/queen-locks/permit"
)

// hostOf is the host:port of a route URL.
func hostOf(url string) string {
	rest := url[strings.Index(url, "://")+3:]
	host, _, _ := strings.Cut(rest, "/")
	return host
}

// slowCall opens a connection and sends a call's headers, declaring a body
// of length bytes, and the first bytes of that body; the body's rest never
// comes. It answers the connection, which the caller closes.
func slowCall(t *testing.T, url, token string, length int) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", hostOf(url))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: queen-locks\r\nContent-Type: application/json\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n{", route.Path, token, length)
	return conn
}

// holdRoom makes a slow call that the route has admitted: once it holds its
// room, a get from probe, which applies nothing, is refused. A slow call
// that lost the race to a probe is refused itself, and made again.
func holdRoom(t *testing.T, url, token string, length int, probe string, pad bool) net.Conn {
	t.Helper()
	for range 50 {
		base := testutil.ToFloat64(route.CallsInFlight)
		conn := slowCall(t, url, token, length)
		awaitInFlight(t, base, 1)
		if code, _ := call(t, url, probe, padded(body("", `{"op":"get","name":"probe"}`), pad)); code == http.StatusTooManyRequests {
			return conn
		}
		conn.Close()
	}
	t.Fatal("the slow call never held its room")
	return nil
}

// padded makes a call's body larger than route.SmallBody, when pad, with
// white space after it.
func padded(b string, pad bool) string {
	if !pad {
		return b
	}
	return b + strings.Repeat(" ", 2*route.SmallBody)
}

// awaitInFlight waits until n more calls than base are in progress.
func awaitInFlight(t *testing.T, base float64, n int) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return testutil.ToFloat64(route.CallsInFlight) >= base+float64(n), nil
	})
	if err != nil {
		t.Fatalf("%v calls in progress, want %v", testutil.ToFloat64(route.CallsInFlight), base+float64(n))
	}
}

// Past each bound a call is answered 429 with Retry-After, and applies
// nothing; other callers go on.
func TestBeyondTheLimitsIs429AndAppliesNothing(t *testing.T) {
	installRoles(t)
	ns := namespace(t)
	a := serviceAccount(t, ns, "a", "queen-locks-holder")
	b := serviceAccount(t, ns, "b", "queen-locks-holder")
	withLimits := func(set func(*route.Limits)) string {
		l := route.DefaultLimits()
		set(&l)
		url, stop, err := env.StartRouteConfig(route.Config{Auth: route.AuthToken, Limits: l})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		return url
	}
	refused := func(t *testing.T, url, tok, lock string, pad bool) {
		t.Helper()
		resp, out := post(t, url, bearer("Bearer", tok), padded(body("", acquire(lock, "o", 30, 0)), pad))
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" {
			t.Fatalf("answered %d (Retry-After %q): %v", resp.StatusCode, resp.Header.Get("Retry-After"), out)
		}
		if !strings.Contains(errorOf(t, out)["message"].(string), "nothing was applied") {
			t.Fatalf("message %v", out)
		}
		for _, p := range permits(t, ns) {
			if p.Spec.Lock == lock {
				t.Fatalf("a refused call acquired %s", lock)
			}
		}
	}
	cases := []struct {
		name   string
		set    func(*route.Limits)
		length int
		// refused and allowed callers while a's slow call is in progress
		refused, allowed []string
	}{
		{"calls", func(l *route.Limits) { l.MaxCalls = 1 }, 100, []string{b}, nil},
		{"calls of one caller", func(l *route.Limits) { l.MaxCallsPerCaller = 1 }, 100, []string{a}, []string{b}},
		{"body memory", func(l *route.Limits) { l.MaxBodyMemory = route.MaxBody }, route.MaxBody, []string{a, b}, nil},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			url := withLimits(c.set)
			// Verified and authorized once, so the slow call's token needs
			// no review, and both callers draw on the whole body memory.
			for _, tok := range []string{a, b} {
				if code, out := call(t, url, tok, body("", `{"op":"get","name":"warm"}`)); code != http.StatusOK {
					t.Fatalf("answered %d: %v", code, out)
				}
			}
			// A body of up to route.SmallBody is never refused for
			// memory: the body memory case refuses larger ones.
			pad := c.name == "body memory"
			conn := holdRoom(t, url, a, c.length, c.refused[0], pad)
			defer conn.Close()
			for j, tok := range c.refused {
				refused(t, url, tok, fmt.Sprintf("refused-%d-%d", i, j), pad)
			}
			for j, tok := range c.allowed {
				lock := fmt.Sprintf("allowed-%d-%d", i, j)
				if code, out := call(t, url, tok, body("", acquire(lock, "o", 30, 0))); code != http.StatusOK {
					t.Fatalf("another caller answered %d: %v", code, out)
				}
			}
			// Once the slow call is gone, its room is free again.
			conn.Close()
			lock := fmt.Sprintf("after-%d", i)
			err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
				code, _ := call(t, url, b, body("", acquire(lock, "o", 30, 0)))
				return code == http.StatusOK, nil
			})
			if err != nil {
				t.Fatal("the route did not free the slow call's room")
			}
		})
	}
}

// Credentials come before the body: a caller without them is refused
// without the route reading what it sends, and a declared body over the
// limit is refused without reading it either.
func TestNothingIsReadBeforeCredentials(t *testing.T) {
	installRoles(t)
	ns := namespace(t)
	tok := serviceAccount(t, ns, "w", "queen-locks-holder")
	for _, c := range []struct {
		token  string
		length int
		code   int
	}{{"", route.MaxBody, 401}, {"not-a-token", route.MaxBody, 401}, {tok, route.MaxBody + 1, 413}} {
		conn := slowCall(t, tokenURL, c.token, c.length)
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("no answer before the body was sent: %v", err)
		}
		resp.Body.Close()
		conn.Close()
		if resp.StatusCode != c.code {
			t.Fatalf("token %q, %d bytes: answered %d, want %d", c.token, c.length, resp.StatusCode, c.code)
		}
	}
}

// Slow headers and slow bodies are cut off at their timeouts.
func TestSlowCallsAreCutOff(t *testing.T) {
	installRoles(t)
	ns := namespace(t)
	tok := serviceAccount(t, ns, "w", "queen-locks-holder")
	l := route.DefaultLimits()
	l.ReadHeaderTimeout, l.ReadTimeout = time.Second, 2*time.Second
	url, stop, err := env.StartRouteConfig(route.Config{Auth: route.AuthToken, Limits: l})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	t.Run("headers", func(t *testing.T) {
		conn, err := net.Dial("tcp", hostOf(url))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: queen-locks\r\n", route.Path)
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err = io.ReadAll(conn)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("the route kept a connection whose headers never ended")
		}
	})
	t.Run("body", func(t *testing.T) {
		conn := slowCall(t, url, tok, 100)
		defer conn.Close()
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("no answer to a body that never ended: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("answered %d", resp.StatusCode)
		}
	})
}

// memoryLimit is the manager container's memory limit in the chart.
func memoryLimit(t *testing.T) int64 {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(controlplane.Root(), "charts", "queen-locks", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Resources struct {
			Limits struct {
				Memory string `json:"memory"`
			} `json:"limits"`
		} `json:"resources"`
	}
	if err := yaml.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	q, err := resource.ParseQuantity(v.Resources.Limits.Memory)
	if err != nil {
		t.Fatalf("the chart's memory limit %q: %v", v.Resources.Limits.Memory, err)
	}
	return q.Value()
}

// Under slow headers, slow bodies and many large bodies from authenticated
// callers, with the route's default limits, another caller's acquire and a
// guarded write through the webhook (served by the same process) still
// answer, and memory stays under the chart's limit.
func TestAnAttackDoesNotStarveOthers(t *testing.T) {
	installRoles(t)
	ns := namespace(t)
	ctx := context.Background()
	legit := serviceAccount(t, ns, "legit", "queen-locks-holder")
	var attackers []string
	for i := range 3 {
		attackers = append(attackers, serviceAccount(t, ns, fmt.Sprint("attacker-", i), "queen-locks-holder"))
	}
	url, stop, err := env.StartRouteConfig(route.Config{Auth: route.AuthToken})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	host := hostOf(url)

	// A guarded ConfigMap, written under a lock the legitimate caller holds.
	code, out := call(t, url, legit, body("", acquire("fence", "legit", 300, 0)))
	if code != http.StatusOK {
		t.Fatalf("acquire answered %d: %v", code, out)
	}
	fence := num(t, out["results"].([]any)[0].(J)["token"])
	guard := fmt.Sprintf("fence#0=%d", fence)
	// The attackers have rights, and the route has seen them: they draw on
	// the whole body memory (callers it has not seen draw on less; see
	// TestRightlessCallersCannotTakeTheRoute).
	for _, a := range attackers {
		if code, out := call(t, url, a, body("", `{"op":"get","name":"fence"}`)); code != http.StatusOK {
			t.Fatalf("an attacker's first call answered %d: %v", code, out)
		}
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "report",
		Labels: map[string]string{permit.GuardedLabel: "true"}, Annotations: map[string]string{permit.GuardAnnotation: guard}},
		Data: map[string]string{"round": "start"}}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}

	base := testutil.ToFloat64(route.CallsInFlight)
	attack, stopAttack := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var answered, bodiesRefused atomic.Int64
	// Slow headers: a line a second, never ending.
	for range 100 {
		wg.Go(func() {
			for attack.Err() == nil {
				conn, err := net.Dial("tcp", host)
				if err != nil {
					continue
				}
				context.AfterFunc(attack, func() { conn.Close() })
				_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: queen-locks\r\n", route.Path)
				for err == nil && attack.Err() == nil {
					select {
					case <-attack.Done():
					case <-time.After(time.Second):
					}
					_, err = io.WriteString(conn, "X-Slow: yes\r\n")
				}
				conn.Close()
			}
		})
	}
	// Slow bodies of 1 MiB from authenticated callers: 4 KiB every 200 ms.
	chunk := bytes.Repeat([]byte(" "), 4<<10)
	for i := range 30 {
		wg.Go(func() {
			tok := attackers[i%len(attackers)]
			for attack.Err() == nil {
				conn, err := net.Dial("tcp", host)
				if err != nil {
					continue
				}
				context.AfterFunc(attack, func() { conn.Close() })
				_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: queen-locks\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n", route.Path, tok, route.MaxBody)
				for err == nil && attack.Err() == nil {
					select {
					case <-attack.Done():
					case <-time.After(200 * time.Millisecond):
					}
					_, err = conn.Write(chunk)
				}
				conn.Close()
			}
		})
	}
	// Many whole bodies of 1 MiB, as fast as the route takes them; one
	// shared buffer, so the attack's own memory stays out of the count.
	big := []byte(`{"operations":[` + strings.Repeat(" ", route.MaxBody-len(`{"operations":[]}`)) + `]}`)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	for i := range 16 {
		wg.Go(func() {
			for attack.Err() == nil {
				req, _ := http.NewRequestWithContext(attack, http.MethodPost, url, bytes.NewReader(big))
				req.Header.Set("Authorization", "Bearer "+attackers[i%len(attackers)])
				resp, err := hc.Do(req)
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				answered.Add(1)
				if resp.StatusCode == http.StatusTooManyRequests {
					bodiesRefused.Add(1)
				}
			}
		})
	}
	var peak atomic.Uint64
	wg.Go(func() {
		for attack.Err() == nil {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if used := m.HeapInuse + m.StackInuse; used > peak.Load() {
				peak.Store(used)
			}
			select {
			case <-attack.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	defer func() { stopAttack(); wg.Wait() }()

	// The attack is on once the slow bodies are being read.
	// All the attackers call from loopback, one source: the route holds an
	// eighth of its body memory for it, 8 bodies of 1 MiB.
	awaitInFlight(t, base, 8)
	// Starved is what this test tells apart from served: a call refused
	// 429, or held while the attack goes on (it never ends by itself, so a
	// starved call would reach the client's 30 s timeout). How fast a
	// served call is belongs to make bench; this bound is far above a
	// served call's time even on a loaded machine.
	const bound = 10 * time.Second
	legitClient := &http.Client{Timeout: 30 * time.Second}
	// Rounds go on until many large bodies have been answered, so the
	// legitimate calls are measured throughout the attack, not before it.
	const minRounds, minBodies, maxRounds = 5, 64, 500
	for round := 0; round < minRounds || answered.Load() < minBodies; round++ {
		if round == maxRounds {
			t.Fatalf("only %d large bodies answered in %d rounds", answered.Load(), round)
		}
		lock := fmt.Sprint("legit-", round)
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body("", acquire(lock, "legit", 30, 0))))
		req.Header.Set("Authorization", "Bearer "+legit)
		start := time.Now()
		resp, err := legitClient.Do(req)
		acquireTook := time.Since(start)
		if err != nil {
			t.Fatalf("round %d: acquire: %v", round, err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), `"acquired":true`) || acquireTook > bound {
			t.Fatalf("round %d: acquire answered %d in %s: %s", round, resp.StatusCode, acquireTook, raw)
		}

		start = time.Now()
		err = retryOnConflict(func() error {
			cur := &corev1.ConfigMap{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cm), cur); err != nil {
				return err
			}
			cur.Annotations[permit.GuardAnnotation] = guard
			cur.Data["round"] = fmt.Sprint(round)
			return env.Client.Update(ctx, cur)
		})
		writeTook := time.Since(start)
		if err != nil || writeTook > bound {
			t.Fatalf("round %d: guarded write: %v in %s", round, err, writeTook)
		}
		if round < minRounds || round%20 == 0 {
			t.Logf("round %d: acquire %s, guarded write %s", round, acquireTook.Round(time.Millisecond), writeTook.Round(time.Millisecond))
		}
	}
	t.Logf("%v calls in progress at the end of the rounds", testutil.ToFloat64(route.CallsInFlight)-base)
	stopAttack()
	wg.Wait()
	limit := memoryLimit(t)
	t.Logf("peak heap and stacks %d MiB (limit %d MiB); %d large bodies answered, %d of them 429", peak.Load()>>20, limit>>20, answered.Load(), bodiesRefused.Load())
	if int64(peak.Load()) >= limit {
		t.Fatalf("peak heap and stacks %d bytes, over the chart's memory limit %d", peak.Load(), limit)
	}
}

func retryOnConflict(f func() error) error {
	for {
		err := f()
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

// The read timeout bounds reading a call, not running it: a call whose
// operations take longer (an acquire that waits, an API server that is
// slow) runs to its own timeout. (net/http lifts the read deadline once the
// body is read; this keeps it so.)
func TestLongCallsOutliveTheReadTimeout(t *testing.T) {
	// An API server that accepts connections and never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	l := route.DefaultLimits()
	l.ReadTimeout = 500 * time.Millisecond
	const opTimeout = 3 * time.Second
	url, stop, err := env.StartRouteConfig(route.Config{Auth: route.AuthNone, DefaultNamespace: "default", Limits: l,
		OpTimeout: opTimeout, REST: &rest.Config{Host: "http://" + ln.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	start := time.Now()
	code, out := call(t, url, "", body("", `{"op":"get","name":"slow"}`))
	took := time.Since(start)
	if code != http.StatusServiceUnavailable {
		t.Fatalf("answered %d: %v", code, out)
	}
	if took < opTimeout {
		t.Fatalf("the call was cut off after %s, before its operation's timeout %s", took, opTimeout)
	}
}

// Callers with a valid token and no rights cannot hold the body memory
// that callers with rights need: sixteen of them, each holding every call
// it may open with a body it never sends (1 MiB and 64 KiB), leave the
// calls of a holder that this replica has never seen (a new pod, or one
// that last called the other replica) all answered.
func TestRightlessCallersCannotTakeTheRoute(t *testing.T) {
	installRoles(t)
	ns := namespace(t)
	holder := serviceAccount(t, ns, "holder", "queen-locks-holder")
	// Every call here comes from loopback; in a cluster each identity is a
	// pod of its own address. Lift the per-address bounds, which would
	// otherwise stop the attack first, so that body memory is what is
	// tested.
	l := route.DefaultLimits()
	l.MaxConnectionsPerSource, l.MaxCallsPerSource = l.MaxConnections, l.MaxCalls
	url, stop, err := env.StartRouteConfig(route.Config{Auth: route.AuthToken, Limits: l})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	base := testutil.ToFloat64(route.CallsInFlight)
	for i := range 16 {
		nobody := serviceAccount(t, ns, fmt.Sprintf("nobody-%d", i), "")
		for j := range l.MaxCallsPerCaller {
			size := route.MaxBody
			if j%2 == 1 {
				size = route.LargeBody
			}
			conn := slowCall(t, url, nobody, size)
			t.Cleanup(func() { conn.Close() })
		}
	}
	// Each rightless caller keeps at least one call reading its body.
	awaitInFlight(t, base, 16)
	for i := range 20 {
		lock := fmt.Sprintf("busy-%d", i)
		code, out := call(t, url, holder, body("", acquire(lock, "h", 30, 0)))
		if code != http.StatusOK || out["results"].([]any)[0].(J)["acquired"] != true {
			t.Fatalf("the holder's acquire %d answered %d: %v", i, code, out)
		}
		r := out["results"].([]any)[0].(J)
		rel := fmt.Sprintf(`{"op":"release","name":%q,"token":%d,"owner":"h"}`, lock, num(t, r["token"]))
		if code, out := call(t, url, holder, body("", rel)); code != http.StatusOK {
			t.Fatalf("the holder's release %d answered %d: %v", i, code, out)
		}
	}
	// A second holder, new to this replica, in the middle of it all.
	other := serviceAccount(t, ns, "holder-2", "queen-locks-holder")
	if code, out := call(t, url, other, body("", `{"op":"get","name":"busy-0"}`)); code != http.StatusOK {
		t.Fatalf("a new holder's first call answered %d: %v", code, out)
	}
}

// One call carries up to 64 waiting acquires: the replica's places for
// waiters are bounded per caller by operation, so one caller cannot switch
// waiting off for everyone else. Its acquires past the bound answer at
// once; another caller still waits.
func TestOneCallerTakesAtMostItsShareOfTheWaiters(t *testing.T) {
	installRoles(t)
	ns, other := namespace(t), namespace(t)
	a := serviceAccount(t, ns, "a", "queen-locks-holder")
	b := serviceAccount(t, other, "b", "queen-locks-holder")
	per := route.DefaultLimits().MaxCallsPerCaller
	n := per + 4
	var held, waits []string
	for i := range n + 1 {
		held = append(held, acquire(fmt.Sprintf("w%d", i), "x", 60, 0))
		waits = append(waits, acquireWaiting(fmt.Sprintf("w%d", i), "y", 60, 0, 60))
	}
	if code, out := call(t, tokenURL, a, body("", held...)); code != http.StatusOK {
		t.Fatalf("holding: %d %v", code, out)
	}
	if code, out := call(t, tokenURL, b, body("", acquire("theirs", "x", 60, 0))); code != http.StatusOK {
		t.Fatalf("holding: %d %v", code, out)
	}
	base := env.Waker.Waiting()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tokenURL, strings.NewReader(body("", waits[:n]...)))
		req.Header = bearer("Bearer", a)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waiting(t, base+per)
	// One more of a's waiting acquires answers at once (held), and the
	// replica never holds more than a's share of a's waiters.
	answered := make(chan J, 1)
	go func() {
		_, out := call(t, tokenURL, a, body("", waits[n]))
		answered <- out
	}()
	var out J
	if err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		if env.Waker.Waiting() > base+per {
			return false, fmt.Errorf("%d of one caller's acquires wait, past its share of %d", env.Waker.Waiting()-base, per)
		}
		select {
		case out = <-answered:
			return true, nil
		default:
			return false, nil
		}
	}); err != nil {
		t.Fatal(err)
	}
	if r := out["results"].([]any)[0].(J); r["acquired"] != false || r["reason"] != "held" {
		t.Fatalf("the acquire past the caller's share answered %v, want held at once", r)
	}
	// Another caller, another namespace, still waits and wins.
	got := make(chan J, 1)
	go func() {
		_, out := call(t, tokenURL, b, body(other, acquireWaiting("theirs", "y", 60, 0, 60)))
		got <- out
	}()
	waiting(t, base+per+1)
	if code, out := call(t, tokenURL, b, body(other, `{"op":"release","name":"theirs","owner":"x","token":`+lookupToken(t, other, "theirs")+`}`)); code != http.StatusOK {
		t.Fatalf("releasing: %d %v", code, out)
	}
	if r := (<-got)["results"].([]any)[0].(J); r["acquired"] != true {
		t.Fatalf("the other caller's waiting acquire answered %v", r)
	}
}

// lookupToken reads the token of slot 0 of lock in ns from its permit.
func lookupToken(t *testing.T, ns, lock string) string {
	t.Helper()
	for _, p := range permits(t, ns) {
		if p.Spec.Lock == lock {
			return p.ResourceVersion
		}
	}
	t.Fatalf("no permit of %s in %s", lock, ns)
	return ""
}
