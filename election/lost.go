package election

import (
	"fmt"
)

// Token is the permit's current token while this Lock holds it (it changes
// at every renew), and 0 when it does not: not elected, released, lost, or
// its lease over on this machine's clock (counted from when its last
// successful renew was sent) without a renew getting through.
func (l *Lock) Token() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.liveLocked() {
		return 0
	}
	return l.token
}

// liveLocked tells whether the Lock holds the permit and its lease is
// not over on this machine's clock; l.mu is held.
func (l *Lock) liveLocked() bool {
	return l.holding != nil && l.lost == nil && l.clock.Now().Before(l.validUntil)
}

// Lost is the reason the leadership was lost, nil while it was not.
func (l *Lock) Lost() error { return l.lostErr() }

func (l *Lock) lostErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// loseLocked ends the Lock's leadership for good; l.mu is held.
func (l *Lock) loseLocked(why error) error {
	if l.lost == nil {
		l.lost = fmt.Errorf("%w: %w", ErrLost, why)
		l.holding, l.token = nil, 0
	}
	return l.lost
}

// lose ends the Lock's leadership for good.
func (l *Lock) lose(why error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_ = l.loseLocked(why) // the loss is recorded; its error is for Get and Update
}
