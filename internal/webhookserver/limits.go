package webhookserver

import (
	"fmt"
	"time"
)

// Limits bound what callers of the webhook port can make the manager hold.
// Every permit write, guarded write and gated pod create in the cluster
// waits for this server (failurePolicy Fail), so a caller that is not the
// API server must not be able to exhaust it.
type Limits struct {
	// ReadHeaderTimeout bounds the TLS handshake and reading a review's
	// headers: a caller that dribbles them is cut off.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole review, headers and body. The API
	// server sends a review at once; a body that trickles in is not its.
	ReadTimeout time.Duration
	// WriteTimeout bounds a review from the end of its headers to the end
	// of its answer; above the longest webhook timeout (30 s).
	WriteTimeout time.Duration
	// IdleTimeout bounds how long a kept-alive connection waits for its
	// next review.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a review's headers.
	MaxHeaderBytes int
	// MaxConnections bounds open connections; more wait to be accepted.
	// Reviews are served over HTTP/1.1 only, so it also bounds the reviews
	// in progress, and with SmallBody the bytes of small bodies held.
	MaxConnections int
	// MaxConnectionsPerSource bounds the open connections from one
	// address; more are closed at once.
	MaxConnectionsPerSource int
	// MaxBody is the largest review read; a larger one is answered 413
	// without reading it.
	MaxBody int64
	// MaxBodyMemory bounds the bytes of bodies above SmallBody held at
	// once (each counts its Content-Length, or MaxBody when it sends
	// none); a review whose body does not fit is answered 429.
	MaxBodyMemory int64
	// MaxBodyMemoryPerSource bounds the same per address, unless the
	// caller presented a verified client certificate (the API server).
	MaxBodyMemoryPerSource int64
}

// SmallBody is the size up to which a review's body is read without a
// reservation: every permit review, and most guarded writes and pods, fit
// in it. MaxConnections of them at most are held at once, so a flood of
// large bodies never turns them away.
const SmallBody = 64 << 10

// The largest object the API server admits, JSON-encoded. A write's body
// is at most 3 MiB (the API server's request body limit, twice the 1.5 MiB
// etcd stores per value, because JSON is larger than the protobuf stored).
// A review carries the new object and, for an update or delete, the old
// one; everything else in it (user, groups, options, names) is small.
const (
	maxObject   = 3 << 20
	maxEnvelope = 256 << 10
	// DefaultMaxBody is the largest review the API server sends: two
	// objects of the largest size and their envelope (6.25 MiB).
	DefaultMaxBody = 2*maxObject + maxEnvelope
)

// DefaultLimits are the webhook server's limits unless configured
// otherwise. At worst the server holds MaxBodyMemory of large bodies and
// MaxConnections*SmallBody of small ones (80 MiB), and decodes at most
// largeDecodes large ones at once: a few hundred MiB at the very most,
// under the chart's memory limit of 512 MiB.
func DefaultLimits() Limits {
	return Limits{
		ReadHeaderTimeout:       5 * time.Second,
		ReadTimeout:             15 * time.Second,
		WriteTimeout:            40 * time.Second,
		IdleTimeout:             90 * time.Second,
		MaxHeaderBytes:          32 << 10,
		MaxConnections:          256,
		MaxConnectionsPerSource: 64,
		MaxBody:                 DefaultMaxBody,
		MaxBodyMemory:           64 << 20,
		MaxBodyMemoryPerSource:  16 << 20,
	}
}

// Check refuses limits that cannot work, naming the flag.
func (l Limits) Check() error {
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--webhook-read-header-timeout", l.ReadHeaderTimeout}, {"--webhook-read-timeout", l.ReadTimeout},
		{"--webhook-write-timeout", l.WriteTimeout}, {"--webhook-idle-timeout", l.IdleTimeout}} {
		if d.v <= 0 {
			return fmt.Errorf("%s is %s: it must be above 0", d.flag, d.v)
		}
	}
	for _, n := range []struct {
		flag string
		v    int64
	}{{"--webhook-max-header-bytes", int64(l.MaxHeaderBytes)}, {"--webhook-max-connections", int64(l.MaxConnections)},
		{"--webhook-max-connections-per-source", int64(l.MaxConnectionsPerSource)}} {
		if n.v < 1 {
			return fmt.Errorf("%s is %d: it must be at least 1", n.flag, n.v)
		}
	}
	if l.MaxBody < SmallBody {
		return fmt.Errorf("--webhook-max-body is %d bytes: it must be at least %d, or the API server's ordinary reviews would be refused", l.MaxBody, SmallBody)
	}
	if l.MaxBodyMemoryPerSource < l.MaxBody {
		return fmt.Errorf("--webhook-max-body-memory-per-source is %d bytes: it must hold at least one largest review (--webhook-max-body, %d bytes)", l.MaxBodyMemoryPerSource, l.MaxBody)
	}
	if l.MaxBodyMemory < l.MaxBodyMemoryPerSource {
		return fmt.Errorf("--webhook-max-body-memory is %d bytes: it must be at least --webhook-max-body-memory-per-source (%d bytes)", l.MaxBodyMemory, l.MaxBodyMemoryPerSource)
	}
	return nil
}
