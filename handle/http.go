package handle

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/wire"
)

// HTTPOptions configure the route transport.
type HTTPOptions struct {
	// Namespace to send in each call; empty lets the route take the token's.
	Namespace string
	// Token is a bearer token; TokenFile, when set, is read at every call
	// instead, since projected ServiceAccount tokens are rotated on disk.
	Token     string
	TokenFile string
	// Client is the HTTP client; http.DefaultClient with a timeout if nil.
	Client *http.Client
}

// CallError is an answer of the route other than 200.
type CallError struct {
	Code    int
	Message string
}

func (e *CallError) Error() string { return fmt.Sprintf("route answered %d: %s", e.Code, e.Message) }

// HTTP is the route transport: url is the route's full address, for example
// http://queen-locks.queen-locks.svc:6632/api/v1/locks.
func HTTP(url string, o HTTPOptions) Transport {
	if o.Client == nil {
		o.Client = &http.Client{Timeout: 30 * time.Second}
	}
	return &httpTransport{url: url, o: o}
}

type httpTransport struct {
	url string
	o   HTTPOptions
}

func (h *httpTransport) Namespace() string { return h.o.Namespace }

// call sends one operation and answers its result.
func (h *httpTransport) call(ctx context.Context, op map[string]any) (wire.Result, error) {
	body := map[string]any{"operations": []any{op}}
	if h.o.Namespace != "" {
		body["namespace"] = h.o.Namespace
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return wire.Result{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(raw))
	if err != nil {
		return wire.Result{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	token := h.o.Token
	if h.o.TokenFile != "" {
		b, err := os.ReadFile(h.o.TokenFile)
		if err != nil {
			return wire.Result{}, fmt.Errorf("reading the token: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := h.o.Client.Do(req)
	if err != nil {
		return wire.Result{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return wire.Result{}, err
	}
	if resp.StatusCode != http.StatusOK {
		var e wire.ErrorResponse
		if json.Unmarshal(data, &e) != nil || e.Error.Code == 0 {
			e.Error = wire.Error{Code: resp.StatusCode, Message: strings.TrimSpace(string(data))}
		}
		return wire.Result{}, &CallError{Code: e.Error.Code, Message: e.Error.Message}
	}
	var out wire.Response
	if err := json.Unmarshal(data, &out); err != nil || len(out.Results) != 1 {
		return wire.Result{}, fmt.Errorf("the route answered something that is not one result: %q", data)
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
	a := locks.Acquired{Acquired: r.Acquired != nil && *r.Acquired, Already: r.Already, Reason: r.Reason}
	if a.Acquired {
		a.Permit = permitOf(r)
	}
	if r.Holders != nil {
		for _, wh := range *r.Holders {
			a.Holders = append(a.Holders, holderOf(wh))
		}
	}
	return a, nil
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

func permitOf(r wire.Result) locks.Permit {
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

func holderOf(w wire.Holder) locks.Holder {
	h := locks.Holder{Slot: w.Slot, Owner: w.Owner, Token: w.Token}
	h.Since, _ = time.Parse(time.RFC3339Nano, w.Since)
	h.RenewedAt, _ = time.Parse(time.RFC3339Nano, w.RenewedAt)
	h.ExpiresAt, _ = time.Parse(time.RFC3339Nano, w.ExpiresAt)
	return h
}
