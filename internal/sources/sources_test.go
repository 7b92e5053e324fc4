package sources

import (
	"net"
	"testing"
)

func TestTallyKeepsKeysApartAndGivesBackOnce(t *testing.T) {
	var c Tally
	leave, ok := c.Take("a", 3, 4)
	if !ok {
		t.Fatal("a first take of 3 of 4 was refused")
	}
	if _, ok := c.Take("a", 2, 4); ok {
		t.Fatal("a take past most was granted")
	}
	if _, ok := c.Take("b", 4, 4); !ok {
		t.Fatal("another key was refused for a's weight")
	}
	leave()
	leave()
	if _, ok := c.Take("a", 4, 4); !ok {
		t.Fatal("what was given back was not free again")
	}
	if len(c.n) != 2 {
		t.Fatalf("keys kept: %v", c.n)
	}
}

func TestEnterCountsOne(t *testing.T) {
	var c Tally
	if _, ok := c.Enter("x", 1); !ok {
		t.Fatal("the first enter was refused")
	}
	if _, ok := c.Enter("x", 1); ok {
		t.Fatal("a second enter past most 1 was granted")
	}
}

func TestOf(t *testing.T) {
	for in, want := range map[string]string{"127.0.0.1:80": "127.0.0.1", "[::1]:9443": "::1", "pipe": "pipe"} {
		if got := Of(in); got != want {
			t.Errorf("Of(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLimitListenerClosesASourcesConnectionsPastMax(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan struct{}, 1)
	l := LimitListener(ln, 1, func() { refused <- struct{}{} })
	defer l.Close()
	accepted := make(chan net.Conn, 2)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	first, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	held := <-accepted
	second, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	<-refused
	if n, _ := second.Read(make([]byte, 1)); n != 0 {
		t.Fatal("the connection past max was served")
	}
	held.Close()
	third, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	(<-accepted).Close()
}
