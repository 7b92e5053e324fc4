package handle_test

import (
	"context"
	"fmt"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/queen-locks/queen-locks/handle"
)

// A program that calls the route from many goroutines at once keeps its
// connections: with net/http's own default of two idle connections per
// host, eight callers opened a new connection for most of their calls,
// which costs the route's process more than the call itself.
func TestHandlesOfOneProcessKeepTheirConnectionsAlive(t *testing.T) {
	ns := namespace(t)
	url, _ := startRoute(t, ns)
	const callers, rounds = 8, 15
	var opened, calls atomic.Int64
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(c httptrace.GotConnInfo) {
		calls.Add(1)
		if !c.Reused {
			opened.Add(1)
		}
	}})
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for w := range callers {
		// A handle each, made with the shipped defaults: no Client given.
		tr := handle.HTTP(url, handle.HTTPOptions{Namespace: ns})
		wg.Go(func() {
			lock, owner := fmt.Sprint("keepalive-", w), fmt.Sprint("w", w)
			for range rounds {
				a, err := tr.Acquire(ctx, lock, owner, 30, 1)
				if err == nil && !a.Acquired {
					err = fmt.Errorf("%s not acquired: %s", lock, a.Reason)
				}
				if err == nil {
					_, err = tr.Release(ctx, lock, 0, a.Token, owner)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// At most one connection per caller: every call in flight at once has
	// its own, and each is kept for the next.
	if n := opened.Load(); n > callers {
		t.Errorf("%d callers opened %d connections for %d calls; want at most %d", callers, n, calls.Load(), callers)
	}
}
