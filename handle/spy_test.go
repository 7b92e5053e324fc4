package handle_test

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/locks"
)

// errDropped stands for an answer lost on the way back: the call was applied.
var errDropped = errors.New("test: the answer was lost")

// spy wraps a real transport: it counts calls, can lose answers of calls it
// did make, fail renews, and shift the server's times in answers as a
// server whose clock is ahead of ours (behind, with a negative shift) would.
type spy struct {
	handle.Transport
	acquires, renews, releases atomic.Int32
	dropAcquires               atomic.Int32 // this many acquires are applied, then answered errDropped
	failRenews                 atomic.Bool
	shift                      time.Duration
}

func (s *spy) Acquire(ctx context.Context, name, owner string, ttl int64, limit int) (locks.Acquired, error) {
	s.acquires.Add(1)
	a, err := s.Transport.Acquire(ctx, name, owner, ttl, limit)
	if err == nil && s.dropAcquires.Add(-1) >= 0 {
		return locks.Acquired{}, errDropped
	}
	a.ExpiresAt = shifted(a.ExpiresAt, s.shift)
	for i := range a.Holders {
		a.Holders[i].ExpiresAt = shifted(a.Holders[i].ExpiresAt, s.shift)
	}
	return a, err
}

func (s *spy) Renew(ctx context.Context, name string, slot int, token uint64, owner string, ttl int64) (locks.Renewed, error) {
	s.renews.Add(1)
	if s.failRenews.Load() {
		return locks.Renewed{}, errors.New("test: renews fail")
	}
	rn, err := s.Transport.Renew(ctx, name, slot, token, owner, ttl)
	rn.ExpiresAt = shifted(rn.ExpiresAt, s.shift)
	return rn, err
}

func (s *spy) Release(ctx context.Context, name string, slot int, token uint64, owner string) (bool, error) {
	s.releases.Add(1)
	return s.Transport.Release(ctx, name, slot, token, owner)
}

func shifted(t time.Time, d time.Duration) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Add(d)
}
