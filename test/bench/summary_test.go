package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestOffTarget(t *testing.T) {
	row := func(op string, api map[string]float64) callRow {
		return callRow{path: "route", op: op, n: 40, d: tally{api: api}}
	}
	rows := []callRow{
		row("acquire, free lock", map[string]float64{"POST queenlocks": 40, "POST tokenreviews": 1}),
		row("release", map[string]float64{"GET queenlocks": 40, "DELETE queenlocks": 40}),
		row("acquire, held by another owner", map[string]float64{"POST queenlocks": 40, "GET queenlocks": 40}),
		row("no such operation", map[string]float64{"GET queenlocks": 40}),
	}
	want := []string{"route, release: 2 calls", "route, no such operation: 1 calls"}
	if d := cmp.Diff(want, offTarget(rows)); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

func TestSummaryWrite(t *testing.T) {
	s := summary{
		callsRun: true,
		ratio8:   0.41, floor8: 0.68,
		tokenVs:      map[int]float64{1: 0.97, 8: 0.95, 32: 0.88},
		tokenSteady:  map[int]float64{1: 0.99, 8: 0.89, 32: 0.98},
		tokenCPU8:    1.04,
		renewP99:     map[int]time.Duration{250: 50 * time.Millisecond, 1000: 400 * time.Millisecond},
		leaseP99:     map[int]time.Duration{250: 30 * time.Millisecond, 1000: 90 * time.Millisecond},
		renewLargest: 250,
	}
	got := s.write()
	for _, want := range []string{
		"API calls per operation:** met",
		"0.6 of the Lease baseline** (0.30 before one call per operation): not met, 0.41",
		"reached 0.68",
		"Token auth within 10% of no auth:** not met for callers that keep calling (0.99, 0.89 and 0.98",
		"reviews expired: 0.97, 0.95 and 0.88",
		"the steps stopped before 2000",
		"the largest step under 250.0 ms: 250 held permits",
		"p99 of 30.0 ms at 250, 90.0 ms at 1000",
		"## Against the targets for renew cost, route cycles and handoff",
		"Route cycles at 8 clients at least 0.9 of the CRD copy's:** not met, 0.60 (0.41 and 0.68 of the Lease baseline)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
}

func TestSemaphoreHandoffTarget(t *testing.T) {
	wait := gaps{p50: 10 * time.Millisecond, p99: 40 * time.Millisecond}
	poll := gaps{p50: 20 * time.Millisecond, p99: 80 * time.Millisecond}
	s := summary{semWait: &wait, semPoll: &poll}
	if got := s.costTargets(); !strings.Contains(got, "below polling's:** met, p99 40.0 ms (p50 10.0 ms) against polling's 80.0 ms (p50 20.0 ms)") {
		t.Errorf("%s", got)
	}
	poll.p99 = 35 * time.Millisecond // under the target, but above polling
	if got := s.costTargets(); !strings.Contains(got, "below polling's:** not met") {
		t.Errorf("a handoff slower than polling's is not met:\n%s", got)
	}
	wait.p99, poll.p99 = 60*time.Millisecond, 90*time.Millisecond
	if got := s.costTargets(); !strings.Contains(got, "below polling's:** not met") {
		t.Errorf("a p99 over 50 ms is not met:\n%s", got)
	}
}

func TestRenewCost(t *testing.T) {
	s := summary{
		renewP99:       map[int]time.Duration{250: 20 * time.Millisecond, 3000: 300 * time.Millisecond},
		renewCPU:       map[int]float64{250: 4.5, 3000: 3.0},
		leaseCPU:       map[int]float64{250: 3.0, 3000: 2.5},
		leaseUpdateCPU: map[int]float64{250: 2.5, 3000: 2.0},
		floorCPU:       map[int]float64{250: 4.5, 3000: 3.0},
	}
	got := s.renewCost()
	for _, want := range []string{
		"at most 1.5 times a Lease renew's** (1.9 before): met; the route's to a Lease renewed by merge patch: 1.50 at 250, 1.20 at 3000",
		"as client-go's leader election renews: 1.80 at 250, 1.50 at 3000",
		"by the same update: 1.00 at 250, 1.00 at 3000",
		"3000 held permits with p99 under 250.0 ms** (494 ms before): not met, 300.0 ms",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("renew cost lacks %q:\n%s", want, got)
		}
	}
	s.renewCPU[3000] = 3.8
	if got := s.renewCost(); !strings.Contains(got, "(1.9 before): not met") {
		t.Errorf("a step at 1.52 times a Lease's is not met:\n%s", got)
	}
}

func TestLineTargets(t *testing.T) {
	s := summary{line: &lineResult{
		stopLeft: []time.Duration{5 * time.Second, 6900 * time.Millisecond},
		goneLeft: []time.Duration{4 * time.Millisecond, 30 * time.Millisecond},
		lockP99:  100 * time.Millisecond, semP99: 150 * time.Millisecond,
		ratio: spread{1.5, 1.2, 2.4},
	}}
	got := s.write()
	for _, want := range []string{
		"within ttlSeconds and two sweeps (8s) of the stop:** met, at most 6900.0 ms over 2",
		"at once (under 1s):** met, at most 30.0 ms over 2",
		"at most 2 times the lock's** (waiters over two replicas, the median of the rounds): met, 1.50 (1.20 to 2.40) (p99 150.0 ms against 100.0 ms",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the line's targets lack %q:\n%s", want, got)
		}
	}
	s.line.stopLeft = append(s.line.stopLeft, 8100*time.Millisecond)
	s.line.goneLeft = append(s.line.goneLeft, time.Second)
	s.line.ratio = spread{2.1, 1.9, 3}
	got = s.lineTargets()
	for _, want := range []string{"of the stop:** not met", "(under 1s):** not met", "the median of the rounds): not met"} {
		if !strings.Contains(got, want) {
			t.Errorf("the line's targets lack %q:\n%s", want, got)
		}
	}
}
