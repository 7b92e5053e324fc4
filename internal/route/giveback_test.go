package route_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/route"
)

// holdCreate holds the API server's answer to the next create of a permit
// once armed: the permit is stored, and the replica that sent the create
// learns it only when the test lets the answer through.
type holdCreate struct {
	rt      http.RoundTripper
	mu      sync.Mutex
	armed   bool
	held    chan struct{} // closed when an answer is held
	release chan struct{} // closed to let it through
}

func (h *holdCreate) arm() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed, h.held, h.release = true, make(chan struct{}), make(chan struct{})
}

func (h *holdCreate) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := h.rt.RoundTrip(r)
	h.mu.Lock()
	hold := h.armed && r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/queenlocks")
	held, release := h.held, h.release
	if hold {
		h.armed = false
	}
	h.mu.Unlock()
	if hold {
		close(held)
		<-release
	}
	return resp, err
}

// logged records the messages a replica logs.
type logged struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logged) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, `"msg"="`+msg) {
			n++
		}
	}
	return n
}

func (l *logged) await(t *testing.T, msg string, n int) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return l.count(msg) >= n, nil
	}); err != nil {
		t.Fatalf("replica 0 logged %q %d times, want %d", msg, l.count(msg), n)
	}
}

const (
	wentAway = "the caller went away"
	callEnd  = "lock call"
)

// A caller whose acquire landed on one replica, but whose answer it never
// got, retries on the other replica: it is answered already with the same
// token, and renews. The first replica, finding its caller gone, must not
// free that permit: its owner is the caller's, who holds it now. Only an
// acquire whose owner the route minted is given back, at the version it
// created and no later one.
func TestAGiveBackNeverFreesWhatARetryHolds(t *testing.T) {
	hold := &holdCreate{}
	log := &logged{}
	tp := env.Production(t, controlplane.TopologyOptions{Prefix: "giveback", Replica: func(i int, c *route.Config) {
		if i != 0 {
			return
		}
		c.REST.Wrap(func(rt http.RoundTripper) http.RoundTripper { hold.rt = rt; return hold })
		c.Log = funcr.New(func(prefix, args string) {
			log.mu.Lock()
			defer log.mu.Unlock()
			log.msgs = append(log.msgs, args)
		}, funcr.Options{Verbosity: 1})
	}})
	r0, r1 := tp.Replicas[0], tp.Replicas[1]
	calls := 0

	// lost sends op to replica 0 and goes away once the permit is
	// stored, before its answer; the replica goes on once let.
	lost := func(t *testing.T, op string) (letGo func()) {
		t.Helper()
		hold.arm()
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r0, strings.NewReader(body(tp.LockNS, op)))
			req.Header.Set("Authorization", "Bearer "+tp.Token)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		<-hold.held
		cancel()
		<-done
		calls++
		log.await(t, wentAway, calls)
		return func() {
			close(hold.release)
			log.await(t, callEnd, calls)
		}
	}

	t.Run("the caller's own owner", func(t *testing.T) {
		letGo := lost(t, acquire("report", "cron-7", 600, 0))
		retry := results(t, tp, r1, acquire("report", "cron-7", 600, 0))[0]
		if retry["acquired"] != true || retry["already"] != true {
			t.Fatalf("the retry on the other replica: %v", retry)
		}
		renewed := results(t, tp, r1, renewOp("report", "cron-7", num(t, retry["token"])))[0]
		if renewed["renewed"] != true {
			t.Fatalf("renew: %v", renewed)
		}
		letGo()
		p, ok := permitOf(t, tp.LockNS, "report")
		if !ok || p.ResourceVersion != fmt.Sprint(num(t, renewed["token"])) {
			t.Fatalf("after replica 0 finished the lost call, the permit the caller holds (token %v) is %v (exists %v)", renewed["token"], p.ResourceVersion, ok)
		}
	})

	t.Run("a minted owner, renewed since by its token", func(t *testing.T) {
		letGo := lost(t, acquire("minted", "", 600, 0))
		got := results(t, tp, r1, `{"op":"get","name":"minted"}`)[0]
		hs, _ := got["holders"].([]any)
		if len(hs) != 1 {
			t.Fatalf("get: %v", got)
		}
		token := num(t, hs[0].(J)["token"])
		renewed := results(t, tp, r1, fmt.Sprintf(`{"op":"renew","name":"minted","token":%d,"ttlSeconds":600}`, token))[0]
		if renewed["renewed"] != true {
			t.Fatalf("renew by token: %v", renewed)
		}
		letGo()
		if p, ok := permitOf(t, tp.LockNS, "minted"); !ok || p.ResourceVersion != fmt.Sprint(num(t, renewed["token"])) {
			t.Fatalf("the give-back was carried through to the renewed permit: %v (exists %v)", p.ResourceVersion, ok)
		}
	})

	t.Run("a minted owner, untouched", func(t *testing.T) {
		letGo := lost(t, acquire("orphan", "", 600, 0))
		letGo()
		if p, ok := permitOf(t, tp.LockNS, "orphan"); ok {
			t.Fatalf("an acquire nobody can learn the owner of was not given back: %s held by %s", p.Name, p.Spec.Owner)
		}
	})
}
