package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/wire"
)

// Client is one contender: it loops acquire, guarded write, renew, guarded
// write, release, and logs every call as an Op.
type Client struct {
	ID        int
	RouteURL  string
	Namespace string
	Lock      string
	Object    string // the guarded ConfigMap
	TTL       int64  // seconds
	Kube      kubernetes.Interface
	HTTP      *http.Client
	Rand      *rand.Rand
	Log       func(Op)

	cycle int
}

// Run loops until stop is closed, finishing the call in hand.
func (c *Client) Run(ctx context.Context, stop <-chan struct{}) {
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	for !stopped() {
		c.cycle++
		owner := fmt.Sprintf("c%d.%d", c.ID, c.cycle)
		token, ok := c.acquire(ctx, owner, stop)
		if !ok {
			c.pause(50, 250)
			continue
		}
		c.pause(0, 300)
		c.write(ctx, owner, token)
		c.pause(0, 300)
		op := c.call(ctx, Op{Kind: KindRenew, Owner: owner, Token: token, TTL: c.TTL})
		if op.Outcome != Renewed {
			continue // lost, or not known: a new cycle with a new owner
		}
		token = op.NewToken
		c.pause(0, 300)
		c.write(ctx, owner, token)
		if c.Rand.IntN(8) == 0 {
			continue // walk away without releasing: the lease must run out
		}
		c.call(ctx, Op{Kind: KindRelease, Owner: owner, Token: token})
	}
}

// acquire tries once, and again with the same owner while the answer is
// unknown (a retry answers "already" if the first one won).
func (c *Client) acquire(ctx context.Context, owner string, stop <-chan struct{}) (uint64, bool) {
	for {
		op := c.call(ctx, Op{Kind: KindAcquire, Owner: owner, TTL: c.TTL})
		switch op.Outcome {
		case Acquired, Already:
			return op.NewToken, true
		case Unknown, Failed:
			select {
			case <-stop:
				return 0, false
			case <-time.After(200 * time.Millisecond):
			}
		default:
			return 0, false
		}
	}
}

func (c *Client) pause(minMS, maxMS int) {
	time.Sleep(time.Duration(minMS+c.Rand.IntN(maxMS-minMS+1)) * time.Millisecond)
}

// call makes one lock operation through the route and logs it.
func (c *Client) call(ctx context.Context, op Op) Op {
	op.Client = c.ID
	w := map[string]any{"op": op.Kind, "name": c.Lock, "owner": op.Owner}
	if op.Kind == KindAcquire || op.Kind == KindRenew {
		w["ttlSeconds"] = op.TTL
	}
	if op.Kind != KindAcquire {
		w["slot"], w["token"] = 0, op.Token
	}
	body, _ := json.Marshal(map[string]any{"namespace": c.Namespace, "operations": []any{w}})
	op.Call = time.Now().UnixNano()
	res, err := c.post(ctx, body)
	op.Return = time.Now().UnixNano()
	switch {
	case errors.As(err, new(*refusedCall)):
		op.Outcome, op.Error = Failed, err.Error()
		op.BadCall = true
	case errors.Is(err, syscall.ECONNREFUSED):
		op.Outcome, op.Error = Failed, err.Error() // the manager is down: nothing was sent
	case err != nil:
		op.Outcome, op.Error = Unknown, err.Error()
	default:
		fill(&op, res)
	}
	c.Log(op)
	return op
}

func (c *Client) post(ctx context.Context, body []byte) (wire.Result, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.RouteURL, bytes.NewReader(body))
	if err != nil {
		return wire.Result{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return wire.Result{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return wire.Result{}, err
	}
	if resp.StatusCode >= 400 && resp.StatusCode < 500 {
		// The route refused the call whole: nothing was applied, and the
		// harness sent something wrong.
		return wire.Result{}, &refusedCall{fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(raw)))}
	}
	if resp.StatusCode != http.StatusOK {
		return wire.Result{}, fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(raw)))
	}
	var out wire.Response
	if err := json.Unmarshal(raw, &out); err != nil || len(out.Results) != 1 {
		return wire.Result{}, fmt.Errorf("unreadable answer %q: %v", raw, err)
	}
	return out.Results[0], nil
}

// refusedCall is a 4xx answer of the route.
type refusedCall struct{ msg string }

func (e *refusedCall) Error() string { return e.msg }

// fill records the route's answer in op.
func fill(op *Op, r wire.Result) {
	if r.Token != nil {
		op.NewToken = *r.Token
	}
	op.ExpiresAt = parseStamp(r.ExpiresAt)
	switch {
	case r.Already:
		op.Outcome = Already
	case r.Acquired != nil && *r.Acquired:
		op.Outcome = Acquired
	case r.Renewed != nil && *r.Renewed:
		op.Outcome = Renewed
	case r.Released != nil && *r.Released:
		op.Outcome = Released
	case r.Reason == "held":
		op.Outcome = Held
		if r.Holders != nil && len(*r.Holders) > 0 {
			h := (*r.Holders)[0]
			op.HolderOwner, op.HolderToken, op.HolderExpires = h.Owner, h.Token, parseStamp(h.ExpiresAt)
		}
	case r.Reason == "contended":
		op.Outcome = Contended
	case r.Reason == "lost":
		op.Outcome = Lost
	default:
		op.Outcome, op.Error = Unknown, fmt.Sprintf("unexpected answer %+v", r)
	}
}

func parseStamp(s string) int64 {
	if s == "" {
		return 0
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0
	}
	return t.UnixNano()
}

// write bumps the ConfigMap's counter under the guard of token: read,
// then update with the read's resourceVersion, again on a plain conflict.
func (c *Client) write(ctx context.Context, owner string, token uint64) {
	for try := 0; try < 3; try++ {
		cm, err := c.Kube.CoreV1().ConfigMaps(c.Namespace).Get(ctx, c.Object, metav1.GetOptions{})
		if err != nil {
			return // nothing sent
		}
		n, _ := strconv.ParseInt(cm.Data["counter"], 10, 64)
		n++
		cm.Data = map[string]string{"counter": strconv.FormatInt(n, 10), "token": strconv.FormatUint(token, 10), "writer": owner}
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		cm.Annotations[permit.GuardAnnotation] = permit.Guard{Lock: c.Lock, Slot: 0, Token: token}.String()
		op := Op{Client: c.ID, Kind: KindWrite, Owner: owner, Token: token, Counter: n, Call: time.Now().UnixNano()}
		got, err := c.Kube.CoreV1().ConfigMaps(c.Namespace).Update(ctx, cm, metav1.UpdateOptions{})
		op.Return = time.Now().UnixNano()
		switch {
		case err == nil:
			op.Outcome = Written
			op.Version, _ = permit.Token(got.ResourceVersion)
		case strings.Contains(err.Error(), "kv_precondition"):
			op.Outcome, op.Error = Refused, err.Error()
		case apierrors.IsConflict(err) || strings.Contains(err.Error(), "failed calling webhook"):
			// The compare-and-swap failed, or admission could not run:
			// nothing was stored.
			op.Outcome, op.Error = Failed, err.Error()
		default:
			op.Outcome, op.Error = Unknown, err.Error()
		}
		c.Log(op)
		if !apierrors.IsConflict(err) || op.Outcome == Refused {
			return
		}
	}
}
