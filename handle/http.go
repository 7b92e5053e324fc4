package handle

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/routeapi"
)

// TokenFileEnv names the environment variable that points handles and the
// CLI at the route's token when none is given.
const TokenFileEnv = "QUEEN_LOCKS_TOKEN_FILE"

// ProjectedTokenFile is where the docs mount the pod's projected
// ServiceAccount token of audience queen-locks, the token the route accepts.
const ProjectedTokenFile = "/var/run/secrets/queen-locks/token"

// HTTPOptions configure the route transport.
type HTTPOptions struct {
	// Namespace to send in each call; empty lets the route take the token's.
	Namespace string
	// Token is a bearer token. TokenFile, when set, is read instead, and
	// read again when it changes (see TokenReread), since projected
	// ServiceAccount tokens are rotated on disk. With neither, the
	// transport reads the file $QUEEN_LOCKS_TOKEN_FILE names, else
	// ProjectedTokenFile when it exists (a missing one is looked for again
	// after TokenReread), else sends no token.
	Token     string
	TokenFile string
	// CAFile is a PEM bundle of the CAs that sign the route's certificate,
	// for an https:// URL. It is read again at every call and trusted
	// afresh when its content changes. Empty trusts the system's roots.
	CAFile string
	// Client is the HTTP client; nil uses one with a 90 s timeout whose
	// kept-alive connections every such handle of the process shares. With a
	// CAFile its Transport must be an *http.Transport (or nil): the CAs are
	// set on a copy of it.
	Client *http.Client
}

// defaultHTTPTransport carries the calls of every route transport made
// without a Client. The route is fastest over kept-alive connections (a
// new connection per call costs the route's process more than the call's
// own work), and net/http keeps only two idle connections per host by
// default: a program with more calls than that in flight at once, say
// eight locks renewed in the background, would open and close a connection
// for most of them. This one keeps up to the route's connection bound per
// caller address (--route-max-connections-per-source, 64) and otherwise
// behaves as http.DefaultTransport: proxies from the environment, HTTP/2
// where TLS offers it.
var defaultHTTPTransport = func() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 64
	return t
}()

// CallError is an answer of the route other than 200.
type CallError struct {
	Code    int
	Message string
	// Field is the field of the call the route refused, when it names one
	// (a 400 for a bad or unknown field): tell refusals apart by it, not
	// by the message's words.
	Field string
}

func (e *CallError) Error() string { return fmt.Sprintf("route answered %d: %s", e.Code, e.Message) }

// HTTP is the route transport: url is the route's full address, for example
// http://queen-locks.queen-locks.svc:6632/api/v1/locks. A CAFile that cannot
// be read or holds no certificate fails each call, naming the file.
func HTTP(url string, o HTTPOptions) Transport {
	return newHTTP(url, o, ProjectedTokenFile, time.Now)
}

// TokenReread bounds how long a token file's content is sent without
// reading the file again. A token file is read again as soon as another
// file stands at its path (the kubelet rotates a projected token so, by
// swapping a symlink) or its size or modification time changed, which a
// stat of it at every call tells; and in any case once TokenReread has
// passed since it was read. A missing default token file is looked for
// again only after TokenReread: an open that failed at every call cost a
// handle an eighth of its CPU.
const TokenReread = time.Second

// newHTTP is HTTP with the default token file and the clock given.
func newHTTP(url string, o HTTPOptions, projected string, now func() time.Time) Transport {
	if o.Client == nil {
		// Long enough for an acquire that waits the longest the route
		// allows (60 s) and is then carried out; every call also has its
		// caller's context.
		o.Client = &http.Client{Timeout: 90 * time.Second, Transport: defaultHTTPTransport}
	}
	t := &httpTransport{url: url, o: o, client: o.Client, now: now}
	if o.Token == "" && o.TokenFile == "" {
		if f := os.Getenv(TokenFileEnv); f != "" {
			t.o.TokenFile = f
		} else {
			t.o.TokenFile, t.tokenOptional = projected, true
		}
	}
	return t
}

type httpTransport struct {
	url string
	o   HTTPOptions
	// tokenOptional: the token file is the default one, sent when present.
	tokenOptional bool
	now           func() time.Time
	// read is the token file's content and when it was read ("" for a
	// missing default file); nil when the file is to be read again.
	read atomic.Pointer[tokenRead]

	noWait atomic.Bool // the route refused waitSeconds: poll instead
	// answeredNS is the namespace the route's last guard named, for a
	// transport that sends none and lets the route take the token's (or
	// its default).
	answeredNS atomic.Pointer[string]

	mu     sync.Mutex
	client *http.Client // o.Client, or a copy trusting the CAs in ca
	ca     []byte       // the CA file's content client trusts
}

// Namespace is the namespace the calls go to: the one sent, or else the one
// the route last answered it took; empty before any answer.
func (h *httpTransport) Namespace() string {
	if h.o.Namespace != "" {
		return h.o.Namespace
	}
	if ns := h.answeredNS.Load(); ns != nil {
		return *ns
	}
	return ""
}

// httpClient is the client to call with: one trusting the CA file's
// current content. Reading the file at every call costs little beside the
// call, and picks up a rotated CA without a restart.
func (h *httpTransport) httpClient() (*http.Client, error) {
	if h.o.CAFile == "" {
		return h.o.Client, nil
	}
	pem, err := os.ReadFile(h.o.CAFile)
	if err != nil {
		return nil, fmt.Errorf("reading the CA file: %w", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ca != nil && bytes.Equal(pem, h.ca) {
		return h.client, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("the CA file %s holds no PEM certificate", h.o.CAFile)
	}
	var tr *http.Transport
	switch base := h.o.Client.Transport.(type) {
	case nil:
		tr = defaultHTTPTransport.Clone()
	case *http.Transport:
		tr = base.Clone()
	default:
		return nil, fmt.Errorf("a CA file needs the HTTP client's Transport to be an *http.Transport, not %T", base)
	}
	if tr.TLSClientConfig == nil {
		tr.TLSClientConfig = &tls.Config{}
	}
	tr.TLSClientConfig.RootCAs = pool
	tr.TLSClientConfig.MinVersion = max(tr.TLSClientConfig.MinVersion, tls.VersionTLS12)
	if old, ok := h.client.Transport.(*http.Transport); ok && h.ca != nil {
		old.CloseIdleConnections() // they trust the CAs of before
	}
	c := *h.o.Client
	c.Transport = tr
	h.client, h.ca = &c, pem
	return h.client, nil
}

type tokenRead struct {
	token string
	file  os.FileInfo // nil: the default file was missing
	at    time.Time
}

// token is the bearer token to send now, "" for none: the token file's
// content as last read while the file is the same one, of the same size
// and modification time, and TokenReread has not passed. A file that
// cannot be read fails each call and is not remembered, but for a missing
// default file, which means no token.
func (h *httpTransport) token() (string, error) {
	if h.o.TokenFile == "" {
		return h.o.Token, nil
	}
	now := h.now()
	last := h.read.Load()
	if last != nil {
		if age := now.Sub(last.at); age < 0 || age >= TokenReread {
			last = nil
		}
	}
	if last != nil && last.file == nil {
		return "", nil
	}
	fi, err := os.Stat(h.o.TokenFile)
	if err == nil && last != nil && os.SameFile(fi, last.file) &&
		fi.Size() == last.file.Size() && fi.ModTime().Equal(last.file.ModTime()) {
		return last.token, nil
	}
	var b []byte
	if err == nil {
		b, err = os.ReadFile(h.o.TokenFile)
	}
	switch {
	case err == nil:
	case h.tokenOptional && errors.Is(err, fs.ErrNotExist):
		h.read.Store(&tokenRead{at: now})
		return "", nil
	default:
		return "", fmt.Errorf("reading the token: %w", err)
	}
	// fi is of the file before the read: a change between the stat and
	// the read makes the next call read again.
	token := strings.TrimSpace(string(b))
	h.read.Store(&tokenRead{token: token, file: fi, at: now})
	return token, nil
}

// call sends one operation and answers its result.
func (h *httpTransport) call(ctx context.Context, op map[string]any) (routeapi.Result, error) {
	body := map[string]any{"operations": []any{op}}
	if h.o.Namespace != "" {
		body["namespace"] = h.o.Namespace
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return routeapi.Result{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(raw))
	if err != nil {
		return routeapi.Result{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	token, err := h.token()
	if err != nil {
		return routeapi.Result{}, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c, err := h.httpClient()
	if err != nil {
		return routeapi.Result{}, err
	}
	resp, err := c.Do(req)
	if err != nil {
		var cv *tls.CertificateVerificationError
		if errors.As(err, &cv) {
			return routeapi.Result{}, fmt.Errorf("the route's certificate is not trusted (give the CA that signed it as the CA file): %w", err)
		}
		return routeapi.Result{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return routeapi.Result{}, err
	}
	if resp.StatusCode != http.StatusOK {
		if resp.StatusCode == http.StatusUnauthorized {
			// The token sent may be one the file has replaced since:
			// the next call reads the file again.
			h.read.Store(nil)
		}
		var e routeapi.ErrorResponse
		if json.Unmarshal(data, &e) != nil || e.Error.Code == 0 {
			e.Error = routeapi.Error{Code: resp.StatusCode, Message: strings.TrimSpace(string(data))}
		}
		return routeapi.Result{}, &CallError{Code: e.Error.Code, Message: e.Error.Message, Field: e.Error.Field}
	}
	var out routeapi.Response
	if err := json.Unmarshal(data, &out); err != nil || len(out.Results) != 1 {
		return routeapi.Result{}, fmt.Errorf("the route answered something that is not one result: %q", data)
	}
	if g := out.Results[0].Guard; g != nil && g.Namespace != "" {
		h.answeredNS.Store(&g.Namespace)
	}
	return out.Results[0], nil
}

func (h *httpTransport) Acquire(ctx context.Context, name, owner string, ttl int64, limit int) (locks.Acquired, error) {
	op := map[string]any{"op": "acquire", "name": name, "ttlSeconds": ttl, "limit": limit}
	if owner != "" {
		op["owner"] = owner
	}
	r, err := h.call(ctx, op)
	if err != nil {
		return locks.Acquired{}, err
	}
	return acquiredOf(r), nil
}

func acquiredOf(r routeapi.Result) locks.Acquired {
	a := locks.Acquired{Acquired: r.Acquired != nil && *r.Acquired, Already: r.Already, Reason: r.Reason}
	if a.Acquired {
		a.Permit = permitOf(r)
	}
	if r.Holders != nil {
		for _, wh := range *r.Holders {
			a.Holders = append(a.Holders, holderOf(wh))
		}
	}
	if r.Waiting != nil {
		a.Waiting = *r.Waiting
	}
	return a
}

// AcquireWaiting sends waitSeconds: the route holds the call until a slot
// frees or the wait is over. A route that does not know waitSeconds
// answers 400 with field waitSeconds (an unknown field); the handle then
// polls, as it did before.
func (h *httpTransport) AcquireWaiting(ctx context.Context, name, owner string, ttl int64, limit int, wait time.Duration) (locks.Acquired, bool, error) {
	secs := int64(wait / time.Second)
	if secs < 1 || h.noWait.Load() {
		return locks.Acquired{}, false, nil
	}
	op := map[string]any{"op": "acquire", "name": name, "ttlSeconds": ttl, "limit": limit, "waitSeconds": min(secs, 60)}
	if owner != "" {
		op["owner"] = owner
	}
	r, err := h.call(ctx, op)
	var ce *CallError
	if errors.As(err, &ce) && ce.Code == http.StatusBadRequest && ce.Field == "waitSeconds" {
		h.noWait.Store(true)
		return locks.Acquired{}, false, nil
	}
	if err != nil {
		return locks.Acquired{}, true, err
	}
	return acquiredOf(r), true, nil
}

func (h *httpTransport) Renew(ctx context.Context, name string, slot int, token uint64, owner string, ttl int64) (locks.Renewed, error) {
	op := map[string]any{"op": "renew", "name": name, "slot": slot, "token": token}
	if owner != "" {
		op["owner"] = owner
	}
	if ttl > 0 {
		op["ttlSeconds"] = ttl
	}
	r, err := h.call(ctx, op)
	if err != nil {
		return locks.Renewed{}, err
	}
	rn := locks.Renewed{Renewed: r.Renewed != nil && *r.Renewed, Reason: r.Reason}
	if rn.Renewed {
		rn.Permit = permitOf(r)
		rn.Slot, rn.Owner = slot, owner
	}
	return rn, nil
}

func (h *httpTransport) Release(ctx context.Context, name string, slot int, token uint64, owner string) (bool, error) {
	op := map[string]any{"op": "release", "name": name, "slot": slot, "token": token}
	if owner != "" {
		op["owner"] = owner
	}
	r, err := h.call(ctx, op)
	if err != nil {
		return false, err
	}
	return r.Released != nil && *r.Released, nil
}

func (h *httpTransport) Get(ctx context.Context, name string) ([]locks.Holder, error) {
	r, err := h.call(ctx, map[string]any{"op": "get", "name": name})
	if err != nil {
		return nil, err
	}
	hs := []locks.Holder{}
	if r.Holders != nil {
		for _, wh := range *r.Holders {
			hs = append(hs, holderOf(wh))
		}
	}
	return hs, nil
}

func (h *httpTransport) Check(ctx context.Context, name string, slot int, expect uint64) (bool, error) {
	r, err := h.call(ctx, map[string]any{"op": "check", "name": name, "slot": slot, "expect": expect})
	if err != nil {
		return false, err
	}
	return r.OK != nil && *r.OK, nil
}

func permitOf(r routeapi.Result) locks.Permit {
	p := locks.Permit{Owner: r.Owner}
	if r.Slot != nil {
		p.Slot = *r.Slot
	}
	if r.Token != nil {
		p.Token = *r.Token
	}
	p.ExpiresAt, _ = time.Parse(time.RFC3339Nano, r.ExpiresAt)
	return p
}

func holderOf(w routeapi.Holder) locks.Holder {
	h := locks.Holder{Slot: w.Slot, Owner: w.Owner, Token: w.Token}
	h.Since, _ = time.Parse(time.RFC3339Nano, w.Since)
	h.RenewedAt, _ = time.Parse(time.RFC3339Nano, w.RenewedAt)
	h.ExpiresAt, _ = time.Parse(time.RFC3339Nano, w.ExpiresAt)
	return h
}
