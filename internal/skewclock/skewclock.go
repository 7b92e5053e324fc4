// Package skewclock is a clock that runs ahead of or behind the machine's
// by an offset read from a file, which may change while it runs. It exists
// for make chaos alone: the harness runs manager replicas whose clocks
// disagree, as nodes' clocks do, through the manager's test-only flag
// --test-clock-offset-file, which only a manager built with the chaos tag
// has: the manager that ships does not link this package
// (cmd/manager's TestShippedManagerLinksNoTestCode). Nothing else may use
// it.
package skewclock

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// Poll is how often the file is read again.
const Poll = 20 * time.Millisecond

// Clock is the machine's wall clock plus the offset in the file.
type Clock struct {
	offset atomic.Int64
}

// FromFile reads the offset (a Go duration such as "-300ms") from path now
// and every Poll after; a file that cannot be read or parsed later keeps
// the last offset.
func FromFile(path string) (*Clock, error) {
	off, err := read(path)
	if err != nil {
		return nil, err
	}
	c := &Clock{}
	c.offset.Store(int64(off))
	go func() {
		for range time.Tick(Poll) {
			if off, err := read(path); err == nil {
				c.offset.Store(int64(off))
			}
		}
	}()
	return c, nil
}

func read(path string) (time.Duration, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	d, err := time.ParseDuration(strings.TrimSpace(string(raw)))
	if err != nil {
		return 0, fmt.Errorf("clock offset file %s: %w", path, err)
	}
	return d, nil
}

// Write sets the offset of every clock reading path.
func Write(path string, offset time.Duration) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(offset.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Now is the skewed wall time, without a monotonic reading: times from it
// compare by their wall values, as times from another node would.
func (c *Clock) Now() time.Time {
	return time.Now().Round(0).Add(time.Duration(c.offset.Load()))
}

// Since is Now() minus t.
func (c *Clock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
