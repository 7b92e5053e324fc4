// Package sources holds what the route and the webhook server both bound
// per caller: the source address of a connection, a tally of what is held
// per key, and a listener that refuses a source's connections past a
// number. One copy, so the two servers cannot drift apart in how they
// count.
package sources

import (
	"net"
	"sync"
)

// Of is the address part of a remote address: what per-source limits count
// by.
func Of(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return remote
	}
	return host
}

// Tally keeps what is held per key (a caller, a namespace, an address), and
// keeps a key only while something of it is held. The zero value is ready.
type Tally struct {
	mu sync.Mutex
	n  map[string]int64
}

// Take adds w to key, or answers false when that would pass most. leave
// gives it back, once however often it is called.
func (c *Tally) Take(key string, w, most int64) (leave func(), ok bool) {
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

// Enter counts one more of key, or answers false when key has most.
func (c *Tally) Enter(key string, most int) (leave func(), ok bool) {
	return c.Take(key, 1, int64(most))
}

// LimitListener closes at once each connection from an address that
// already has max open, before it reaches the server (and before a TLS
// handshake), calling refused for each: one source cannot hold every
// connection a server allows, idle or slow.
func LimitListener(ln net.Listener, max int, refused func()) net.Listener {
	return &perSource{Listener: ln, max: max, refused: refused}
}

type perSource struct {
	net.Listener
	max     int
	refused func()
	open    Tally
}

func (l *perSource) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		done, ok := l.open.Enter(Of(c.RemoteAddr().String()), l.max)
		if !ok {
			if l.refused != nil {
				l.refused()
			}
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
