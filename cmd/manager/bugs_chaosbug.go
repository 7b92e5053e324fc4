//go:build chaosbug

package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"

	"github.com/queen-locks/queen-locks/manager"
)

// Deliberate bugs, for showing that make chaos catches them
// (docs/safety.md). Only a manager built with -tags chaosbug has them.
var testBug = flag.String("test-bug", "", "TEST ONLY (make chaos, chaosbug build): put in a deliberate bug: no-grace or fourth-holder.")

func testBugs(o *manager.Options) error {
	switch *testBug {
	case "":
	case "no-grace":
		// A takeover (and an expiry) admitted as soon as the permit's
		// expireTime has passed by the replica's clock: no room for skew.
		o.ExpiryGrace = 0
	case "fourth-holder":
		return fourthHolder(o)
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
