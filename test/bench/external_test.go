package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

func TestSpreadOf(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want spread
	}{
		{nil, spread{}},
		{[]float64{0.9}, spread{0.9, 0.9, 0.9}},
		{[]float64{0.97, 0.81, 0.92}, spread{0.92, 0.81, 0.97}},
		{[]float64{1, 0.5, 0.75, 0.25}, spread{0.625, 0.25, 1}},
	} {
		if got := spreadOf(c.in); got != c.want {
			t.Errorf("spreadOf(%v) = %+v, want %+v", c.in, got, c.want)
		}
	}
	if got := (spread{0.92, 0.81, 0.97}).String(); got != "0.92 (0.81 to 0.97)" {
		t.Errorf("got %q", got)
	}
}

func TestRatiosAreTakenRoundByRound(t *testing.T) {
	round := func(cycles int) extRound { return extRound{cycles: cycles, secs: 1} }
	floor := extRow{rounds: []extRound{round(100), round(200), round(0)}}
	route := extRow{rounds: []extRound{round(90), round(100), round(50)}}
	// A round where the floor did nothing has no ratio.
	if got := route.ratios(floor); len(got) != 2 || got[0] != 0.9 || got[1] != 0.5 {
		t.Errorf("got %v, want [0.9 0.5]", got)
	}
	if tot := route.total(); tot.cycles != 240 || tot.secs != 3 {
		t.Errorf("total %+v", tot)
	}
}

func TestStatParent(t *testing.T) {
	comm, ppid := statParent("4242 (kube-apiserver) S 4100 4242 4242 0 -1 4194560")
	if comm != "kube-apiserver" || ppid != 4100 {
		t.Errorf("got %q %d", comm, ppid)
	}
	if comm, ppid := statParent("7 (a (b) c) R 1 7"); comm != "a (b) c" || ppid != 1 {
		t.Errorf("got %q %d", comm, ppid)
	}
	if comm, ppid := statParent("garbage"); comm != "" || ppid != 0 {
		t.Errorf("got %q %d", comm, ppid)
	}
}

func TestClientOf(t *testing.T) {
	for name, want := range map[string]int{"xplain8-1-3": 3, "r-31": 31, "none": 0, "": 0} {
		if got := clientOf(name); got != want {
			t.Errorf("clientOf(%q) = %d, want %d", name, got, want)
		}
	}
}

func TestIssue45Targets(t *testing.T) {
	s := summary{external: &extResult{
		handle: map[int]spread{8: {0.96, 0.9, 0.99}, 32: {0.88, 0.8, 0.95}},
		plain:  map[int]spread{8: {0.97, 0.95, 1.01}, 32: {0.91, 0.9, 0.92}},
	}}
	got := s.externalTargetsMet()
	for _, want := range []string{
		"at 8 clients in their own process at least 0.95 of the floor's** (median of the rounds): met; the Go handle 0.96 (0.90 to 0.99), the plain HTTP/1.1 client 0.97 (0.95 to 1.01)",
		"at 32 clients in their own process at least 0.90 of the floor's** (median of the rounds): not met; the Go handle 0.88 (0.80 to 0.95)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("lacks %q:\n%s", want, got)
		}
	}
	if (summary{}).externalTargetsMet() != "" {
		t.Error("a run without the section says nothing of it")
	}
}

// The plain client is one kept-alive HTTP/1.1 connection: every call of a
// client goes over the first one, and a connection the server closes is
// opened again.
func TestPlainClientKeepsItsConnection(t *testing.T) {
	var conns atomic.Int64
	var closeNext atomic.Bool
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.ProtoMajor != 1 || r.ProtoMinor != 1 || r.Method != http.MethodPost || r.URL.Path != "/api/v1/locks" || !strings.Contains(string(body), `"op":"acquire"`) {
			http.Error(w, fmt.Sprintf("%s %s %s %s", r.Proto, r.Method, r.URL.Path, body), http.StatusBadRequest)
			return
		}
		if closeNext.Swap(false) {
			w.Header().Set("Connection", "close")
		}
		_, _ = io.WriteString(w, `{"results":[{"index":0,"op":"acquire","name":"a","acquired":true,"slot":0,"token":42,"owner":"r"}]}`)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	p := &plainClient{addr: strings.TrimPrefix(srv.URL, "http://"), path: "/api/v1/locks"}
	defer p.close()
	for i := range 5 {
		if i == 3 {
			closeNext.Store(true)
		}
		tok, err := p.acquire(context.Background(), "a")
		if err != nil || tok != 42 {
			t.Fatalf("call %d: %d, %v", i, tok, err)
		}
	}
	// Calls 0 to 3 on the first connection (the fourth answered with
	// Connection: close), the last on a second. The server counts a
	// connection before it reads from it, so before its answer.
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections for 5 calls, one closed by the server; want 2", n)
	}
}

// A kept connection the server closed while it was idle (the route's idle
// timeout) is found closed by the next call, which is sent again on a new
// connection; every connection comes from the client's own address.
func TestPlainClientCallsAgainOnAConnectionClosedWhileIdle(t *testing.T) {
	froms := make(chan string, 4)
	closed := make(chan struct{}, 4)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		_, _ = io.WriteString(w, `{"results":[{"index":0,"op":"acquire","name":"a","acquired":true,"slot":0,"token":42,"owner":"r"}]}`)
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			froms <- c.RemoteAddr().(*net.TCPAddr).IP.String()
		case http.StateClosed:
			closed <- struct{}{}
		}
	}
	srv.Start()
	defer srv.Close()
	p := &plainClient{addr: strings.TrimPrefix(srv.URL, "http://"), path: "/api/v1/locks", from: net.IPv4(127, 0, 1, 9)}
	defer p.close()
	if tok, err := p.acquire(context.Background(), "a"); err != nil || tok != 42 {
		t.Fatalf("first call: %d, %v", tok, err)
	}
	// The server ends its idle connections, as the route does past its
	// idle timeout; the client still holds its end.
	srv.Config.SetKeepAlivesEnabled(false)
	<-closed
	if p.conn == nil {
		t.Fatal("the client dropped its connection by itself; the case is not made")
	}
	if tok, err := p.acquire(context.Background(), "a"); err != nil || tok != 42 {
		t.Fatalf("call on the connection closed while idle: %d, %v", tok, err)
	}
	for range 2 {
		if from := <-froms; from != "127.0.1.9" {
			t.Errorf("a connection came from %s, want the client's own 127.0.1.9", from)
		}
	}
}
