package election_test

import (
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/queen-locks/queen-locks/guard"
)

// proxy is a loopback TCP proxy to kube-apiserver that a test can cut:
// the connection of one client, and only of that one.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	cut    bool
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	go p.serve()
	t.Cleanup(p.cutOff)
	return p
}

func (p *proxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			in.Close()
			out.Close()
			return
		}
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(out, in); out.Close() }()
		go func() { _, _ = io.Copy(in, out); in.Close() }()
	}
}

// cutOff closes every connection through the proxy and refuses new ones.
func (p *proxy) cutOff() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.ln.Close()
	for _, c := range p.conns {
		c.Close()
	}
}

func apiServerAddr(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(env.Config.Host)
	if err != nil || u.Host == "" {
		t.Fatalf("kube-apiserver's address %q: %v", env.Config.Host, err)
	}
	return u.Host
}

// refusedFromTheFirst checks a reconciler's writes: admitted until the
// first refusal; that one the webhook's (the write was sent, and lost the
// leadership) or, unless webhookFirst, the client's, unsent, because the
// lease was over on its clock; every later write refused by the client,
// unsent.
func refusedFromTheFirst(t *testing.T, outs []outcome, webhookFirst bool) {
	t.Helper()
	first := -1
	for i, o := range outs {
		if o.err != nil {
			first = i
			break
		}
	}
	if first < 0 {
		t.Fatal("no write was refused")
	}
	f := outs[first]
	byWebhook := errors.Is(f.err, guard.ErrLost) && guard.IsRefused(f.err) && f.sent == f.before+1
	byClient := errors.Is(f.err, guard.ErrNotHeld) && f.sent == f.before
	if !byWebhook && (webhookFirst || !byClient) {
		t.Fatalf("the first refused write: %v (%d sent), want the webhook's refusal and the loss", f.err, f.sent-f.before)
	}
	for i, o := range outs[first+1:] {
		if !(errors.Is(o.err, guard.ErrLost) || errors.Is(o.err, guard.ErrNotHeld)) || o.sent != o.before {
			t.Fatalf("write %d after the first refusal: %v, %d sent; want refused unsent", i+1, o.err, o.sent-o.before)
		}
	}
	t.Logf("%d writes admitted, then refused: first %v, then %d more unsent", first, f.err, len(outs)-first-1)
}

// afterRefusal tells whether the reconciler made n writes after its first
// refused one.
func afterRefusal(r *reconciler, n int) bool {
	outs := r.since(0)
	for i, o := range outs {
		if o.err != nil {
			return len(outs)-i-1 >= n
		}
	}
	return false
}

// The stale leader, cut off: a's lock reaches kube-apiserver through a
// proxy that is cut, while its reconciler keeps writing through another
// connection, and goes on after a's manager stopped. b takes over. None of
// a's writes after the takeover is stored; its first refused write is the
// webhook's refusal, every later one its client's, unsent.
func TestTheCutOffLeaderCannotWrite(t *testing.T) {
	ns := env.Namespace(t, "cutoff")
	h := record(t, ns)
	px := startProxy(t, apiServerAddr(t))
	a := startReplica(t, ns, "a", replicaOptions{lockHost: "https://" + px.ln.Addr().String(), stubborn: true})
	await(t, "a to lead", a.mgr.Elected())
	eventually(t, "a's writes", func() bool { return h.count("ConfigMap", "a") >= 2 })

	px.cutOff()
	b := startReplica(t, ns, "b", replicaOptions{})
	await(t, "b to lead", b.mgr.Elected())
	eventually(t, "b's writes", func() bool { return h.count("ConfigMap", "b") >= 2 })
	takeover, _ := h.takenOver("b")
	eventually(t, "a's writes after its first refusal", func() bool { return afterRefusal(a.rec, 3) })
	refusedFromTheFirst(t, a.rec.since(0), false)
	select {
	case err := <-a.err:
		if err == nil {
			t.Fatal("a's manager stopped without an error")
		}
		a.err <- err // for the cleanup
	case <-awaitTimeout():
		t.Fatal("a's manager still runs after losing its lease")
	}
	if late := h.writesAfter("a", takeover); len(late) > 0 {
		t.Fatalf("stored writes of a after b's takeover at %d: %v", takeover, late)
	}
}

// The stale leader whose renew goroutine stalls while its reconciler keeps
// writing: its writes are refused once its lease is over by the server's
// clock, and none is stored after b's takeover; when the renew loop goes
// on, the manager stops.
func TestTheLeaderWhoseRenewStallsCannotWrite(t *testing.T) {
	ns := env.Namespace(t, "stall")
	h := record(t, ns)
	renewA := &gate{}
	defer renewA.resume()
	a := startReplica(t, ns, "a", replicaOptions{
		wrap: func(l resourcelock.Interface) resourcelock.Interface { return stalled{l, renewA} },
	})
	await(t, "a to lead", a.mgr.Elected())
	eventually(t, "a's writes", func() bool { return h.count("ConfigMap", "a") >= 2 })

	renewA.pause()
	b := startReplica(t, ns, "b", replicaOptions{})
	await(t, "b to lead", b.mgr.Elected())
	eventually(t, "b's writes", func() bool { return h.count("ConfigMap", "b") >= 2 })
	takeover, _ := h.takenOver("b")
	eventually(t, "a's writes after its first refusal", func() bool { return afterRefusal(a.rec, 3) })
	refusedFromTheFirst(t, a.rec.since(0), false)

	renewA.resume()
	select {
	case err := <-a.err:
		if err == nil {
			t.Fatal("a's manager stopped without an error")
		}
		a.err <- err
	case <-awaitTimeout():
		t.Fatal("a's manager still runs after losing its lease")
	}
	if late := h.writesAfter("a", takeover); len(late) > 0 {
		t.Fatalf("stored writes of a after b's takeover at %d: %v", takeover, late)
	}
}
