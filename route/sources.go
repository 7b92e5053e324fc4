package route

import (
	"net"
	"sync"
)

// sourceOf is the address part of a remote address: what the per-source
// limits count by.
func sourceOf(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return remote
	}
	return host
}

// limitPerSource closes at once each connection from an address that
// already has max open, before it reaches the server: one caller cannot
// hold every connection the route allows, idle or slow.
func limitPerSource(ln net.Listener, max int) net.Listener {
	return &perSource{Listener: ln, max: max, open: map[string]int{}}
}

type perSource struct {
	net.Listener
	max  int
	mu   sync.Mutex
	open map[string]int
}

func (l *perSource) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := sourceOf(c.RemoteAddr().String())
		l.mu.Lock()
		full := l.open[src] >= l.max
		if !full {
			l.open[src]++
		}
		l.mu.Unlock()
		if full {
			refused.WithLabelValues("too_many_connections_of_source").Inc()
			_ = c.Close()
			continue
		}
		return &sourceConn{Conn: c, done: sync.OnceFunc(func() {
			l.mu.Lock()
			if l.open[src]--; l.open[src] == 0 {
				delete(l.open, src)
			}
			l.mu.Unlock()
		})}, nil
	}
}

// sourceConn gives its place back when it is closed, once.
type sourceConn struct {
	net.Conn
	done func()
}

func (c *sourceConn) Close() error {
	c.done()
	return c.Conn.Close()
}
