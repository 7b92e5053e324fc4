package dashboard

import (
	"crypto/subtle"
	"embed"
	"io/fs"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

//go:embed assets
var assets embed.FS

// headers go on every answer, refusals included. The page loads nothing
// from anywhere else and may not be framed; nothing is cached, since the
// rows carry tokens; and no Referer ever carries the URL's secret away.
var headers = map[string]string{
	"Cache-Control":                "no-store",
	"Pragma":                       "no-cache",
	"Referrer-Policy":              "no-referrer",
	"X-Content-Type-Options":       "nosniff",
	"X-Frame-Options":              "DENY",
	"Cross-Origin-Opener-Policy":   "same-origin",
	"Cross-Origin-Resource-Policy": "same-origin",
	"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; " +
		"base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
}

// handler is the whole server: the checks every request passes, then the
// page, its assets, the event stream and the release.
func (s *Server) handler() http.Handler {
	static, _ := fs.Sub(assets, "assets")
	files := http.FileServerFS(static)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		r.URL.Path = "/"
		files.ServeHTTP(w, r)
	})
	for _, f := range []string{"app.js", "style.css"} {
		mux.HandleFunc("GET /"+f, func(w http.ResponseWriter, r *http.Request) {
			if !sameOriginFetch(r) {
				refuse(w, http.StatusForbidden, "the page's own requests only")
				return
			}
			files.ServeHTTP(w, r)
		})
	}
	mux.HandleFunc("GET /events", s.events)
	mux.HandleFunc("POST /release", s.release)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, v := range headers {
			w.Header().Set(k, v)
		}
		// DNS rebinding: a page of another site whose name resolves to
		// 127.0.0.1 reaches this port with its own name in Host.
		if !s.loopbackHost(r.Host) {
			refuse(w, http.StatusMisdirectedRequest, "this server answers only to 127.0.0.1, localhost or [::1] on its own port")
			return
		}
		rest, ok := s.stripSecret(r.URL.Path)
		if !ok {
			// The same answer for a wrong secret as for no page at all.
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead && !sameOrigin(r) {
			refuse(w, http.StatusForbidden, "a request that changes something must come from the page itself (same origin)")
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path, r2.URL.RawPath = rest, ""
		mux.ServeHTTP(w, r2)
	})
}

func refuse(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(msg + "\n"))
}

// loopbackHost says whether a Host header names this server by a loopback
// name and its own port.
func (s *Server) loopbackHost(host string) bool {
	h, p, err := net.SplitHostPort(host)
	if err != nil || p != strconv.Itoa(s.port) {
		return false
	}
	switch strings.ToLower(h) {
	case "127.0.0.1", "localhost", "::1":
		return true
	}
	return false
}

// stripSecret checks the path's first segment against the secret, in
// constant time, and answers the rest of the path.
func (s *Server) stripSecret(path string) (string, bool) {
	p := strings.TrimPrefix(path, "/")
	seg, rest, found := strings.Cut(p, "/")
	if subtle.ConstantTimeCompare([]byte(seg), []byte(s.secret)) != 1 || !found {
		return "", false
	}
	return "/" + rest, true
}

// sameOrigin says whether a request that changes something comes from the
// page: its Origin is this server's, or, without an Origin, the browser
// says it is same-origin. A request with neither is refused: every
// browser sends one or the other on a POST, and a tool that sends
// neither can send the right ones.
func sameOrigin(r *http.Request) bool {
	if o := r.Header.Get("Origin"); o != "" {
		return o == "http://"+r.Host
	}
	return r.Header.Get("Sec-Fetch-Site") == "same-origin"
}

// sameOriginFetch refuses a subresource read that the browser says another
// site asked for (a script tag of another page, say). Without the header
// (an older browser, curl) the secret in the path is the check.
func sameOriginFetch(r *http.Request) bool {
	site := r.Header.Get("Sec-Fetch-Site")
	return site == "" || site == "same-origin"
}

// heartbeat keeps the event stream's connection from looking idle.
const heartbeat = 15 * time.Second

// events is the live stream: the whole state first, then every change.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	if !sameOriginFetch(r) {
		refuse(w, http.StatusForbidden, "the page's own requests only")
		return
	}
	if r.Method == http.MethodHead {
		// The stream never ends: a HEAD gets its headers and no more.
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		return
	}
	sub, snap, ok := s.hub.subscribe()
	if !ok {
		refuse(w, http.StatusServiceUnavailable, "stopping")
		return
	}
	defer s.hub.unsubscribe(sub)
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// A reconnecting page waits a second, not the browser's default three.
	if _, err := w.Write([]byte("retry: 1000\n\n")); err != nil {
		return
	}
	if _, err := w.Write(snap); err != nil || rc.Flush() != nil {
		return
	}
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-sub.gone:
			return
		case <-tick.C:
			if _, err := w.Write([]byte(": ping\n\n")); err != nil {
				return
			}
		case msg := <-sub.ch:
			if _, err := w.Write(msg); err != nil {
				return
			}
			// Whatever else is queued goes in the same flush.
			for more := true; more; {
				select {
				case m := <-sub.ch:
					if _, err := w.Write(m); err != nil {
						return
					}
				default:
					more = false
				}
			}
		}
		if rc.Flush() != nil {
			return
		}
	}
}
