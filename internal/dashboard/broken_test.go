package dashboard_test

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/queen-locks/queen-locks/internal/dashboard"
)

// cutter is a loopback TCP proxy to the API server whose connections can be
// cut on purpose, and refused until it is restored: a watch broken for
// certain, not by hoping for a timing.
type cutter struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{}
}

func newCutter(t *testing.T, target string) *cutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cutter{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() { ln.Close(); c.setCut(true) })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go c.pipe(in)
		}
	}()
	return c
}

func (c *cutter) pipe(in net.Conn) {
	c.mu.Lock()
	if c.cut {
		c.mu.Unlock()
		in.Close()
		return
	}
	out, err := net.Dial("tcp", c.target)
	if err != nil {
		c.mu.Unlock()
		in.Close()
		return
	}
	c.conns[in], c.conns[out] = struct{}{}, struct{}{}
	c.mu.Unlock()
	go func() { _, _ = io.Copy(out, in); out.Close() }()
	_, _ = io.Copy(in, out)
	in.Close()
}

// setCut cuts every connection and refuses new ones, or lets them through.
func (c *cutter) setCut(cut bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut = cut
	if cut {
		for conn := range c.conns {
			conn.Close()
		}
		c.conns = map[net.Conn]struct{}{}
	}
}

// A watch that breaks is shown broken, and when the API server is back the
// page lists again and shows what changed meanwhile.
func TestBrokenWatchIsShown(t *testing.T) {
	ns := env.Namespace(t, "dash-broken")
	u, _ := url.Parse(env.Config.Host)
	proxy := newCutter(t, u.Host)
	cfg := rest.CopyConfig(env.Config)
	cfg.Host = "https://" + proxy.ln.Addr().String()
	s := serve(t, cfg, dashboard.Options{Namespace: ns})
	st := openStream(t, s)
	st.until("permits live", func(m *model) bool { return m.sources["permits"] == "live" })

	proxy.setCut(true)
	st.until("permits broken", func(m *model) bool { return m.sources["permits"] == "broken" })
	a := acquire(t, ns, "while-cut", "someone", 600)
	proxy.setCut(false)
	st.until("permits live again, with the permit acquired meanwhile", func(m *model) bool {
		p, ok := m.permits[ns+"/while-cut.0"]
		return m.sources["permits"] == "live" && ok && p.Token == tokenString(a.Token)
	})
}
