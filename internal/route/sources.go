package route

import "net"

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
	return &perSource{Listener: ln, max: max}
}

type perSource struct {
	net.Listener
	max  int
	open counts
}

func (l *perSource) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		done, ok := l.open.enter(sourceOf(c.RemoteAddr().String()), l.max)
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
