//go:build chaosbug

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"time"

	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/queen-locks/queen-locks/internal/manager"
)

// Deliberate bugs, for showing that make chaos catches them
// (docs/development/safety.md). Only a manager built with -tags chaosbug has them.
var testBug = flag.String("test-bug", "", "TEST ONLY (make chaos, chaosbug build): put in a deliberate bug: no-grace, fourth-holder or rogue-expiry.")

func testBugs(o *manager.Options) error {
	switch *testBug {
	case "":
	case "no-grace":
		// A takeover (and an expiry) admitted as soon as the permit's
		// expireTime has passed by the replica's clock: no room for skew.
		o.ExpiryGrace = 0
	case "fourth-holder":
		return fourthHolder(o)
	case "rogue-expiry":
		return rogueExpiry(o)
	default:
		return fmt.Errorf("--test-bug=%q: no such bug", *testBug)
	}
	return nil
}

// fourthHolder serves the route through a front that raises every
// acquire's limit of 3 to 4: a semaphore of 3 admits a fourth holder.
func fourthHolder(o *manager.Options) error {
	ln, err := net.Listen("tcp", o.RouteAddr)
	if err != nil {
		return err
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	o.RouteAddr = inner.Addr().String()
	inner.Close()
	target, _ := url.Parse("http://" + o.RouteAddr)
	rp := httputil.NewSingleHostReverseProxy(target)
	director := rp.Director
	rp.Director = func(r *http.Request) {
		director(r)
		raw, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		var call map[string]any
		if json.Unmarshal(raw, &call) == nil {
			if ops, ok := call["operations"].([]any); ok {
				for _, op := range ops {
					if m, ok := op.(map[string]any); ok && m["op"] == "acquire" && m["limit"] == float64(3) {
						m["limit"] = 4
					}
				}
				raw, _ = json.Marshal(call)
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(raw))
		r.ContentLength = int64(len(raw))
		r.Header.Set("Content-Length", strconv.Itoa(len(raw)))
	}
	go func() { _ = http.Serve(ln, rp) }()
	return nil
}

// rogueExpiry runs, beside the manager, a second expiry controller that
// takes no part in leader election (as a replica that kept deleting after
// it lost the lead would), on a clock 1.5 s ahead of the replica's: further
// than the grace covers, which leader election and the grace together are
// meant to keep from mattering.
func rogueExpiry(o *manager.Options) error {
	base := o.Clock
	if base == nil {
		base = clock.RealClock{}
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	ro := manager.Options{MetricsAddr: "0", ProbeAddr: "0", WebhookHost: "127.0.0.1", WebhookPort: port, CertDir: o.CertDir,
		ExpiryGrace: o.ExpiryGrace, Clock: ahead{base, 1500 * time.Millisecond}, SkipNameValidation: true}
	// Built once the real manager has registered its controller and
	// metrics, which refuse a second registration that came first.
	go func() {
		time.Sleep(5 * time.Second)
		mgr, err := manager.New(ctrl.GetConfigOrDie(), ro)
		if err != nil {
			ctrl.Log.Error(err, "the rogue expiry controller did not start")
			return
		}
		_ = mgr.Start(context.Background())
	}()
	return nil
}

type ahead struct {
	clock.PassiveClock
	by time.Duration
}

func (a ahead) Now() time.Time                  { return a.PassiveClock.Now().Add(a.by) }
func (a ahead) Since(t time.Time) time.Duration { return a.Now().Sub(t) }

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
