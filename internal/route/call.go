package route

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/queen-locks/queen-locks/internal/sources"
	"github.com/queen-locks/queen-locks/routeapi"
)

func (s *Server) serveLocks(w http.ResponseWriter, r *http.Request) {
	start := s.cfg.Clock.Now()
	code, caller := s.handle(w, r, start)
	observe(requestDuration.WithLabelValues(strconv.Itoa(code)), s.cfg.Clock.Since(start), caller.Username)
}

// handle answers one call. Every refusal comes before any operation runs:
// credentials before the body is read, the body before any right is asked,
// every right before any operation. start is when the call came in.
func (s *Server) handle(w http.ResponseWriter, r *http.Request, start time.Time) (int, Caller) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return writeError(w, callError{Code: http.StatusMethodNotAllowed, Message: "use POST"}), Caller{}
	}
	if s.reviews == nil {
		if msg := fromABrowser(r); msg != "" {
			return writeError(w, callError{Code: http.StatusForbidden, Message: msg}), Caller{}
		}
	}
	leave, ok := s.adm.enter()
	if !ok {
		return s.busy(w, r, Caller{}, "too_many_calls", fmt.Sprintf("the route has %d calls in progress", s.cfg.Limits.MaxCalls)), Caller{}
	}
	defer leave()
	src := sources.Of(r.RemoteAddr)
	leaveSource, ok := s.adm.enterSource(src)
	if !ok {
		return s.busy(w, r, Caller{}, "too_many_calls_of_source", fmt.Sprintf("%s has %d calls in progress", src, s.cfg.Limits.MaxCallsPerSource)), Caller{}
	}
	defer leaveSource()

	var caller Caller
	if s.reviews != nil {
		var f *authFailure
		if caller, f = s.reviews.authenticate(r); f != nil {
			return s.refuse(w, r, caller, "", f), caller
		}
		leaveCaller, ok := s.adm.enterCaller(caller.Username)
		if !ok {
			return s.busy(w, r, caller, "too_many_calls_of_caller", fmt.Sprintf("%s has %d calls in progress", caller.Username, s.cfg.Limits.MaxCallsPerCaller)), caller
		}
		defer leaveCaller()
	}

	req, cerr := s.readCall(w, r, caller)
	if cerr != nil {
		return writeError(w, *cerr), caller
	}
	ns := req.Namespace
	if ns == "" {
		ns = caller.Namespace
	}
	if ns == "" && s.cfg.Auth == AuthNone {
		ns = s.cfg.DefaultNamespace
	}
	if ns == "" {
		return writeError(w, callError{Code: http.StatusBadRequest, Field: "namespace",
			Message: fmt.Sprintf("namespace: is required, as %q is not a ServiceAccount", caller.Username)}), caller
	}
	if s.reviews != nil {
		f := s.reviews.authorize(r.Context(), caller, ns, req.Operations)
		if f == nil || f.code == http.StatusForbidden {
			s.adm.proven.set(caller.Username, f == nil)
		}
		if f != nil {
			return s.refuse(w, r, caller, ns, f), caller
		}
	}
	results, cerr := s.run(r.Context(), caller, ns, req.Operations, start)
	if cerr != nil {
		return writeError(w, *cerr), caller
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(routeapi.Response{Results: results})
	if log := s.cfg.Log.V(1); log.Enabled() {
		log.Info("lock call", "caller", caller.Username, "namespace", ns, "operations", len(results))
	}
	return http.StatusOK, caller
}

// readCall reads and decodes the body, holding memory for it from the
// route's budget only while it does.
func (s *Server) readCall(w http.ResponseWriter, r *http.Request, caller Caller) (*Request, *callError) {
	tooBig := &callError{Code: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("the body is over %d bytes", MaxBody)}
	if r.ContentLength > MaxBody {
		return nil, tooBig
	}
	size := r.ContentLength
	if size < 0 {
		size = MaxBody
	}
	release, ok := s.adm.holdBody(caller.Username, caller.Namespace, sources.Of(r.RemoteAddr), s.reviews != nil, size)
	if !ok {
		refused.WithLabelValues("body_memory").Inc()
		s.cfg.Log.Info("refused a call: the route holds as many bodies as it may", "caller", caller.Username, "remote", r.RemoteAddr)
		w.Header().Set("Retry-After", fmt.Sprint(RetryAfter))
		return nil, &callError{Code: http.StatusTooManyRequests, Message: "the route is reading as many bodies as it may; nothing was applied, try again"}
	}
	defer release()
	var body []byte
	var err error
	if r.ContentLength >= 0 {
		// The server stops the body at its Content-Length: read it into a
		// buffer of exactly that size, never more.
		body = make([]byte, r.ContentLength)
		_, err = io.ReadFull(r.Body, body)
	} else {
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooBig
		}
		return nil, &callError{Code: http.StatusBadRequest, Message: "reading the body failed or took too long"}
	}
	if len(body) >= LargeBody {
		if err := s.adm.decoding.Acquire(r.Context(), 1); err != nil {
			return nil, &callError{Code: http.StatusServiceUnavailable, Message: "the call ended before its body was decoded"}
		}
		defer s.adm.decoding.Release(1)
	}
	req, bad := Decode(body)
	if bad != nil {
		e := callError{Code: http.StatusBadRequest, Message: bad.Error(), Field: bad.Field}
		if bad.Index >= 0 {
			e.Index = &bad.Index
		}
		return nil, &e
	}
	return req, nil
}

// refuse answers a call that failed authentication or authorization.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, caller Caller, ns string, f *authFailure) int {
	refused.WithLabelValues(f.reason).Inc()
	kv := []any{"caller", caller.Username, "namespace", ns, "remote", r.RemoteAddr, "reason", f.reason}
	if f.detail != nil {
		kv = append(kv, "error", f.detail.Error())
	}
	if f.code == http.StatusServiceUnavailable {
		s.cfg.Log.Error(f.detail, "could not review a call", kv...)
	} else {
		s.cfg.Log.Info("refused a call", kv...)
	}
	switch f.code {
	case http.StatusUnauthorized:
		v := `Bearer realm="queen-locks"`
		if f.reason == "invalid_token" {
			v += `, error="invalid_token"`
		}
		w.Header().Set("WWW-Authenticate", v)
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", fmt.Sprint(RetryAfter))
	}
	e := callError{Code: f.code, Message: f.message}
	if f.index >= 0 {
		e.Index = &f.index
	}
	return writeError(w, e)
}

// busy answers 429: the call was not admitted and nothing of it applied.
func (s *Server) busy(w http.ResponseWriter, r *http.Request, caller Caller, reason, why string) int {
	refused.WithLabelValues(reason).Inc()
	s.cfg.Log.Info("refused a call: too many in progress", "caller", caller.Username, "remote", r.RemoteAddr, "reason", reason)
	w.Header().Set("Retry-After", fmt.Sprint(RetryAfter))
	return writeError(w, callError{Code: http.StatusTooManyRequests, Message: why + "; nothing was applied, try again"})
}

// fromABrowser tells why a call without token auth came from a web page,
// or "". Such a route listens on loopback and writes with the manager's
// identity for whoever connects: a page the developer has open could
// otherwise send it a form-encoded or text/plain POST (no preflight), or
// reach it under a name of its own that resolves to 127.0.0.1 (DNS
// rebinding) and read the answers. Browsers send Origin on such a POST and
// the page's name as Host; curl, the handles and the CLI send neither.
func fromABrowser(r *http.Request) string {
	if r.Header.Get("Origin") != "" || r.Header.Get("Sec-Fetch-Site") == "cross-site" {
		return "a call from a web page is refused: this route runs without token auth, for loopback clients only"
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" || host == "" {
		return ""
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return ""
	}
	return fmt.Sprintf("Host %q is refused: this route runs without token auth and answers only to localhost or a loopback address", r.Host)
}
