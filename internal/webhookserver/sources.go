package webhookserver

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

// weights keeps what is held per key, and keeps a key only while something
// of it is. The zero value is ready.
type weights struct {
	mu sync.Mutex
	n  map[string]int64
}

// take adds w to key, or answers false when that would pass most.
func (c *weights) take(key string, w, most int64) (leave func(), ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int64{}
	}
	if c.n[key]+w > most {
		return nil, false
	}
	c.n[key] += w
	return sync.OnceFunc(func() {
		c.mu.Lock()
		if c.n[key] -= w; c.n[key] <= 0 {
			delete(c.n, key)
		}
		c.mu.Unlock()
	}), true
}

// limitPerSource closes at once each connection from an address that
// already has max open, before the TLS handshake.
func limitPerSource(ln net.Listener, max int) net.Listener {
	return &perSource{Listener: ln, max: int64(max)}
}

type perSource struct {
	net.Listener
	max  int64
	open weights
}

func (l *perSource) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		done, ok := l.open.take(sourceOf(c.RemoteAddr().String()), 1, l.max)
		if !ok {
			refused.WithLabelValues("too_many_connections_of_source").Inc()
			_ = c.Close()
			continue
		}
		return &sourceConn{Conn: c, done: done}, nil
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
