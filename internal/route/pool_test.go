package route_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/route"
)

// holdBodiless opens a call from the loopback address src to the route at
// u with the bearer token and a Content-Length of size, and sends no body.
// It asks for 100-continue, which the route sends once it has reserved the
// body's memory and starts reading it: it answers true then, false when
// the route refused the call instead. The connection stays open until the
// test ends.
func holdBodiless(t *testing.T, u, src, token string, size int) bool {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: time.Minute}
	c, err := d.Dial("tcp", pu.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: queen-locks\r\nContent-Type: application/json\r\nAuthorization: Bearer %s\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n",
		route.Path, token, size); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer to a bodiless call: %v", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusContinue:
		return true
	case http.StatusTooManyRequests:
		return false
	}
	t.Fatalf("a bodiless call was answered %d", resp.StatusCode)
	return false
}

// Four callers, each proven by an authorized call in its own namespace,
// send as many calls of the largest body as the route lets them, each from
// its own address (as pods have), headers and no body, to both replicas.
// A holder's renew, through the Service, still gets through on either
// replica; before, they held the whole body budget and every renew was
// answered 429 until the permits expired.
func TestProvenCallersCannotFillTheBodyPool(t *testing.T) {
	tp := env.Production(t, controlplane.TopologyOptions{Prefix: "pool"})
	won := callJ(t, tp.URL, tp.Token, `{"namespace":"`+tp.LockNS+`","operations":[{"op":"acquire","name":"kept","ttlSeconds":600,"owner":"holder"}]}`)
	tok := won["token"]

	l := route.DefaultLimits()
	for i := range 4 {
		ns := env.Namespace(t, fmt.Sprintf("pool-attacker-%d", i))
		attacker := serviceAccount(t, ns, "attacker", "queen-locks-holder")
		src := fmt.Sprintf("127.0.2.%d", i+1)
		for _, replica := range tp.Replicas {
			// Proven: one authorized call in its own namespace.
			if code, out := call(t, replica, attacker, `{"operations":[{"op":"get","name":"x"}]}`); code != http.StatusOK {
				t.Fatalf("the attacker's proving call answered %d: %v", code, out)
			}
			held := 0
			for range l.MaxCallsPerCaller {
				if holdBodiless(t, replica, src, attacker, route.MaxBody) {
					held++
				}
			}
			if held == l.MaxCallsPerCaller {
				t.Fatalf("one proven caller held %d bodies of 1 MiB on one replica: its share is not bounded", held)
			}
		}
	}
	for i, u := range append([]string{tp.URL}, tp.Replicas[:]...) {
		renew := fmt.Sprintf(`{"namespace":"%s","operations":[{"op":"renew","name":"kept","owner":"holder","token":%v,"ttlSeconds":600}]}`, tp.LockNS, tok)
		code, out := call(t, u, tp.Token, renew)
		if code != http.StatusOK || !strings.Contains(fmt.Sprint(out), "renewed:true") {
			t.Fatalf("renew %d while proven callers hold bodies: %d %v", i, code, out)
		}
		tok = out["results"].([]any)[0].(J)["token"]
	}
}

// callJ makes a call that must answer 200 with one result, and answers it.
func callJ(t *testing.T, u, token, body string) J {
	t.Helper()
	code, out := call(t, u, token, body)
	if code != http.StatusOK {
		t.Fatalf("answer %d: %v", code, out)
	}
	return out["results"].([]any)[0].(J)
}
