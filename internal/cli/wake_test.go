package cli_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// apiCounter is a loopback proxy to the control plane's API server that
// counts the requests queenlock makes on permits: the acquires it tries
// (creates) and the watches it opens.
type apiCounter struct {
	mu      sync.Mutex
	creates int
	watches int
}

func (a *apiCounter) counts() (creates, watches int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.creates, a.watches
}

// kubeconfigThroughCounter serves a proxy to the API server until the test
// ends and answers a kubeconfig that reaches the API server through it.
func kubeconfigThroughCounter(t *testing.T) (string, *apiCounter) {
	t.Helper()
	target, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rest.TransportFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	a := &apiCounter{}
	proxy := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:     rt,
		FlushInterval: -1, // pass watch events on as they come
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/queenlocks") {
			a.mu.Lock()
			switch {
			case r.Method == http.MethodPost:
				a.creates++
			case r.Method == http.MethodGet && r.URL.Query().Get("watch") == "true":
				a.watches++
			}
			a.mu.Unlock()
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	cfg := "apiVersion: v1\nkind: Config\n" +
		"clusters: [{name: counted, cluster: {server: " + srv.URL + "}}]\n" +
		"users: [{name: admin, user: {}}]\n" +
		"contexts: [{name: counted, context: {cluster: counted, user: admin}}]\n" +
		"current-context: counted\n"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, a
}

// A run that waits over the Kubernetes API (--kubeconfig) watches the
// lock's permits and is woken when the holder releases: it does not ask
// again and again while the lock stays held, and it runs long before its
// waiting call would have ended by itself.
func TestRunOverTheAPIIsWokenNotPolled(t *testing.T) {
	ns := namespace(t)
	direct := []string{"--kubeconfig", kubeconfig, "-n", ns}
	out, err := cmd("acquire", "woken", direct, "--ttl", "90s", "--owner", "holder").Output()
	var r map[string]any
	if err != nil || json.Unmarshal(out, &r) != nil || r["acquired"] != true {
		t.Fatalf("holder's acquire: %v %s", err, out)
	}
	token := strconv.FormatFloat(r["token"].(float64), 'f', 0, 64)

	counted, api := kubeconfigThroughCounter(t)
	marker := filepath.Join(t.TempDir(), "ran")
	// TTL 90 s: each waiting call waits up to a third of it, 30 s.
	c := cmd("run", "woken", []string{"--kubeconfig", counted, "-n", ns},
		"--ttl", "90s", "--wait", "60s", "--", "touch", marker)
	var stderr syncBuffer
	c.Stderr = &stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- c.Wait() }()
	defer func() {
		if c.ProcessState == nil {
			_ = c.Process.Kill()
		}
	}()

	// A waiter that watches opens its watch at once; one that polls never
	// does, and tries again every second at most.
	deadline := time.Now().Add(15 * time.Second)
	for {
		creates, watches := api.counts()
		if watches > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiting run opened no watch of the permits in 15 s and tried to acquire %d times: it polls; stderr %q",
				creates, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// While the lock stays held, a woken waiter sends nothing more.
	before, _ := api.counts()
	time.Sleep(2 * time.Second)
	if during, _ := api.counts(); during != before {
		t.Fatalf("the waiting run tried to acquire %d times in 2 s while the lock was held: it polls", during-before)
	}

	released := time.Now()
	out, err = cmd("release", "woken", direct, "--token", token, "--owner", "holder").Output()
	if err != nil || !strings.Contains(string(out), `"released": true`) {
		t.Fatalf("holder's release: %v %s", err, out)
	}
	select {
	case err := <-exited:
		if err != nil || !exists(marker) {
			t.Fatalf("the waiting run: %v, ran %v; stderr %q", err, exists(marker), stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("the waiting run did not run within 15 s of the release (its call waits 30 s): not woken; stderr %q", stderr.String())
	}
	t.Logf("ran %v after the release", time.Since(released).Round(time.Millisecond))
}
