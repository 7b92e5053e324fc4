package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestGapsAfter(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ends := []time.Time{at(10), at(120), at(300)}
	starts := []time.Time{at(0), at(40), at(200)}
	want := []time.Duration{30 * time.Millisecond, 80 * time.Millisecond}
	if d := cmp.Diff(want, gapsAfter(ends, starts)); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	if got := gapsAfter(nil, starts); len(got) != 0 {
		t.Errorf("no ends: %v", got)
	}
}

func TestStampsKeepTheFirstTime(t *testing.T) {
	s := newStamps()
	t0 := time.Unix(1000, 0)
	done := make(chan time.Time)
	go func() {
		at, err := s.wait("a", time.Minute)
		if err != nil {
			t.Error(err)
		}
		done <- at
	}()
	s.mark("a", t0)
	s.mark("a", t0.Add(time.Second))
	if got := <-done; !got.Equal(t0) {
		t.Errorf("waited for %v, want %v", got, t0)
	}
	if got, err := s.wait("a", 0); err != nil || !got.Equal(t0) {
		t.Errorf("after: %v %v, want %v", got, err, t0)
	}
	if _, err := s.wait("b", time.Millisecond); err == nil {
		t.Error("a key never marked was seen")
	}
}

func TestGatedVerdict(t *testing.T) {
	g := gatedGaps{finished: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}}
	if got := gatedVerdict(g); !strings.Contains(got, ": met, 200.0 ms over 2 handoffs") {
		t.Errorf("got %q", got)
	}
	g.finished = append(g.finished, 1500*time.Millisecond)
	if got := gatedVerdict(g); !strings.Contains(got, "not met, 1500.0 ms") {
		t.Errorf("got %q", got)
	}
	if ratioOf(time.Second, 0) != 0 || ratioOf(time.Second, 500*time.Millisecond) != 2 {
		t.Error("ratioOf")
	}
}
