package main

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// proxy is a loopback TCP proxy the harness puts between two parts of the
// run, so that it can cut them apart for a while (a network partition on
// one machine) and spread connections over manager replicas as a Service
// would. It passes bytes through untouched: TLS ends at the backends.
//
// A cut backend takes connections and forwards nothing, as a partition
// drops packets: the caller waits, and when the cut heals the connection
// is closed. Connections open when a backend is cut are closed at once.
type proxy struct {
	ln       net.Listener
	backends []string
	// dropAnswer, when set, is asked for each connection whether to drop
	// its answer: the request goes through to the replica, which carries
	// it out, and the connection is cut when the answer starts, so the
	// caller never reads it. The caller's retry, on a connection of its
	// own, reaches the next replica: this is how a renew whose answer was
	// lost comes back with a stale token to a replica that did not answer
	// it.
	dropAnswer func() bool
	dropped    atomic.Int64

	mu     sync.Mutex
	next   int
	cut    []bool
	healed []chan struct{} // closed when the backend's cut heals
	conns  map[net.Conn]int
	closed bool
}

// newProxy listens on listen ("127.0.0.1:0" for any port) and forwards
// each connection to the next backend in turn, trying the others when one
// refuses (a replica being restarted is skipped, as an endpoint that is not
// ready would be).
func newProxy(listen string, backends ...string) (*proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, backends: backends, cut: make([]bool, len(backends)), conns: map[net.Conn]int{}}
	for range backends {
		p.healed = append(p.healed, make(chan struct{}))
	}
	go p.serve()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *proxy) handle(c net.Conn) {
	p.mu.Lock()
	first := p.next
	p.next = (p.next + 1) % len(p.backends)
	p.mu.Unlock()
	for i := range p.backends {
		b := (first + i) % len(p.backends)
		p.mu.Lock()
		cut, healed := p.cut[b], p.healed[b]
		p.mu.Unlock()
		if cut {
			// Partitioned: nothing gets through until the cut heals.
			<-healed
			c.Close()
			return
		}
		up, err := net.DialTimeout("tcp", p.backends[b], 2*time.Second)
		if err != nil {
			continue
		}
		if !p.track(c, b) || !p.track(up, b) {
			c.Close()
			up.Close()
			return
		}
		done := make(chan struct{}, 2)
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			done <- struct{}{}
		}
		go pipe(up, c)
		if p.dropAnswer != nil && p.dropAnswer() {
			go func() {
				// Wait for the answer's first byte: the replica has
				// carried the call out. Then cut the connection.
				var b [1]byte
				if n, _ := up.Read(b[:]); n > 0 {
					p.dropped.Add(1)
				}
				done <- struct{}{}
			}()
		} else {
			go pipe(c, up)
		}
		<-done
		c.Close()
		up.Close()
		p.untrack(c, up)
		return
	}
	c.Close()
}

func (p *proxy) track(c net.Conn, b int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.cut[b] {
		return false
	}
	p.conns[c] = b
	return true
}

func (p *proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

// setCut cuts backend b off (cut true) or heals it; b < 0 means every
// backend.
func (p *proxy) setCut(b int, cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.backends {
		if b >= 0 && i != b || p.cut[i] == cut {
			continue
		}
		p.cut[i] = cut
		if cut {
			for c, cb := range p.conns {
				if cb == i {
					c.Close()
					delete(p.conns, c)
				}
			}
		} else {
			close(p.healed[i])
			p.healed[i] = make(chan struct{})
		}
	}
}

// close stops listening, heals every cut and closes every connection.
func (p *proxy) close() {
	p.setCut(-1, false)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
}
