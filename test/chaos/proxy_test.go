package main

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echo serves one line back per connection, prefixed with name.
func echo(t *testing.T, name string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				_, _ = c.Write([]byte(name + ":" + line))
			}()
		}
	}()
	return ln.Addr().String()
}

func ask(addr string, timeout time.Duration) (string, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("hi\n")); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

func TestTheProxySpreadsCutsAndHeals(t *testing.T) {
	p, err := newProxy("127.0.0.1:0", echo(t, "a"), echo(t, "b"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	seen := map[string]bool{}
	for i := 0; i < 4; i++ {
		got, err := ask(p.addr(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		seen[got] = true
	}
	if !seen["a:hi\n"] || !seen["b:hi\n"] {
		t.Fatalf("answers %v, want both backends", seen)
	}
	// Cut every backend: a call waits, and fails when the cut heals.
	p.setCut(-1, true)
	res := make(chan error, 1)
	go func() { _, err := ask(p.addr(), 30*time.Second); res <- err }()
	select {
	case err := <-res:
		t.Fatalf("a call through a cut answered (%v) before the heal", err)
	case <-time.After(300 * time.Millisecond):
	}
	p.setCut(-1, false)
	if err := <-res; err == nil {
		t.Fatal("the call held during the cut succeeded")
	}
	if got, err := ask(p.addr(), 5*time.Second); err != nil || got == "" {
		t.Fatalf("after the heal: %q %v", got, err)
	}
	// One backend down: every call goes to the other.
	q, err := newProxy("127.0.0.1:0", "127.0.0.1:1", echo(t, "c"))
	if err != nil {
		t.Fatal(err)
	}
	defer q.close()
	for i := 0; i < 3; i++ {
		if got, err := ask(q.addr(), 5*time.Second); err != nil || got != "c:hi\n" {
			t.Fatalf("with one backend refusing: %q %v", got, err)
		}
	}
}
