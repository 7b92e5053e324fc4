package route_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/queen-locks/queen-locks/internal/route"
)

// dialFrom connects to the route from a loopback address of the test's
// choosing: 127.0.0.2 stands for a caller elsewhere in the cluster.
func dialFrom(t *testing.T, url, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	conn, err := d.Dial("tcp", hostOf(url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// closedByServer is whether the server closed conn without answering.
func closedByServer(t *testing.T, conn net.Conn) bool {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := conn.Read(make([]byte, 1))
	return errors.Is(err, io.EOF)
}

// One address cannot hold every connection or every call of the route:
// past its own bounds, connections from it are closed and calls from it
// answered 429, before any token is reviewed, while callers elsewhere go on.
func TestOneAddressCannotTakeEveryConnectionOrCall(t *testing.T) {
	installRoles(t)
	ns := namespace(t)
	tok := serviceAccount(t, ns, "w", "queen-locks-holder")
	l := route.DefaultLimits()
	l.MaxConnectionsPerSource, l.MaxCallsPerSource = 3, 2
	url, stop, err := env.StartRouteConfig(route.Config{Auth: route.AuthToken, Limits: l})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	get := body("", `{"op":"get","name":"r"}`)

	t.Run("connections", func(t *testing.T) {
		var idle []net.Conn
		for range 3 {
			idle = append(idle, dialFrom(t, url, "127.0.0.2"))
		}
		if !closedByServer(t, dialFrom(t, url, "127.0.0.2")) {
			t.Fatal("a fourth connection from one address was kept")
		}
		if code, out := call(t, url, tok, get); code != http.StatusOK {
			t.Fatalf("a caller elsewhere answered %d: %v", code, out)
		}
		for _, c := range idle {
			c.Close()
		}
	})
	t.Run("calls", func(t *testing.T) {
		// Two calls from 127.0.0.3 whose bodies never come: the route has
		// admitted them (a good token) and waits for their bodies.
		base := testutil.ToFloat64(route.CallsInFlight)
		for range 2 {
			c := dialFrom(t, url, "127.0.0.3")
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: queen-locks\r\nContent-Type: application/json\r\nAuthorization: Bearer %s\r\nContent-Length: 100\r\n\r\n{", route.Path, tok)
		}
		awaitInFlight(t, base, 2)
		// A third, with a token the route would have to review.
		c := dialFrom(t, url, "127.0.0.3")
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: queen-locks\r\nContent-Type: application/json\r\nAuthorization: Bearer not-a-token\r\nContent-Length: 2\r\n\r\n{}", route.Path)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests {
			resp = nil
		}
		if resp == nil {
			t.Fatal("a third call from one address was not answered 429")
		}
		if code, out := call(t, url, tok, get); code != http.StatusOK {
			t.Fatalf("a caller elsewhere answered %d: %v", code, out)
		}
	})
}

// A refused call does not keep its connection, so a caller that only sends
// what is refused cannot sit on connections.
func TestARefusedCallClosesItsConnection(t *testing.T) {
	for _, c := range []struct{ method, auth string }{{"GET", ""}, {"POST", "Bearer not-a-token"}, {"POST", ""}} {
		conn := dialFrom(t, tokenURL, "127.0.0.1")
		hdr := ""
		if c.auth != "" {
			hdr = "Authorization: " + c.auth + "\r\n"
		}
		fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: queen-locks\r\n%sContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", c.method, route.Path, hdr)
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		// ReadResponse turns "Connection: close" into Close.
		if resp.StatusCode < 400 || !resp.Close {
			t.Fatalf("%s %q: answered %d without Connection: close", c.method, c.auth, resp.StatusCode)
		}
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("%s %q: the connection stayed open (%v)", c.method, c.auth, err)
		}
	}
}
